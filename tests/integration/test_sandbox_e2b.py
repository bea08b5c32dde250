"""E2B provider end to end through the real e2b SDK, against the local fake control plane and envd."""

from __future__ import annotations

import io
import logging
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for tests.fakes without a shared conftest

from sweflow.errors import SandboxError  # noqa: E402
from sweflow.sandbox.base import Sandbox  # noqa: E402
from sweflow.sandbox.e2b import E2BProvider  # noqa: E402
from sweflow.sandbox.e2b_template import template_inputs  # noqa: E402
from sweflow.sandbox.spec import DEFAULT_START_CMD, TemplateSpec  # noqa: E402
from tests.fakes import FAKE_API_KEY, FakeE2B  # noqa: E402
from tests.fakes.e2b_envd import wait_until  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def fake():
    with FakeE2B() as f:
        yield f


@pytest.fixture
def provider(fake):
    return E2BProvider(**fake.api_params(), request_timeout=2, backoff=0.01)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_lifecycle_create_run_kill(fake, provider):
    sb = provider.create("base", timeout=120, env={"GREETING": "hi"}, metadata={"task": "t1"})
    assert isinstance(sb, Sandbox)
    rec = fake.control.sandboxes[sb.id]
    assert rec["template"] == "base" and rec["metadata"] == {"task": "t1"} and rec["timeout"] == 120
    res = sb.run("echo $GREETING; echo oops >&2", timeout=10)
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (0, "hi\n", "oops\n", False)
    assert sb.id in fake.envd.sandboxes
    sb.kill()
    sb.kill()  # idempotent: one DELETE only
    assert fake.control.count("kill") == 1
    assert sb.id not in fake.envd.sandboxes and sb.id not in fake.control.sandboxes
    with pytest.raises(SandboxError, match="already killed"):
        sb.run("true", timeout=5)


def test_context_manager_kills(fake, provider):
    with provider.create("base", timeout=60) as sb:
        sid = sb.id
        assert sid in fake.control.sandboxes
    assert sid not in fake.control.sandboxes


def test_nonzero_exit_is_a_result(provider):
    with provider.create("base", timeout=60) as sb:
        res = sb.run("echo partial; echo bad >&2; exit 7", timeout=10)
    assert (res.exit_code, res.stdout, res.stderr, res.ok) == (7, "partial\n", "bad\n", False)


def test_timeout_gives_timed_out_result_and_stops_the_command(provider, tmp_path):
    pidfile = tmp_path / "pid"
    with provider.create("base", timeout=60) as sb:
        t0 = time.monotonic()
        res = sb.run(f"echo $$ > {pidfile}; echo started; sleep 30", timeout=1)
        assert time.monotonic() - t0 < 6
        assert res.timed_out and not res.ok and res.exit_code == 124
        assert res.stdout == "started\n"
        pid = int(pidfile.read_text())
        assert wait_until(lambda: not _alive(pid), 5)
        # the sandbox still works after a timeout
        assert sb.run("echo ok", timeout=10).stdout == "ok\n"


def test_env_and_cwd(provider):
    with provider.create("base", timeout=60, env={"A": "sandbox", "B": "sandbox"}) as sb:
        sb.write_file("work/sub/marker.txt", "m")
        res = sb.run('echo "$A $B"; pwd; cat marker.txt', timeout=10, env={"B": "command"}, cwd="work/sub")
        lines = res.stdout.splitlines()
        assert lines[0] == "sandbox command"
        assert lines[1].endswith("/work/sub")
        assert lines[2] == "m"
        with pytest.raises(SandboxError, match="no/such/dir"):
            sb.run("pwd", timeout=10, cwd="no/such/dir")


def test_background_start_poll_and_kill(provider, tmp_path):
    with provider.create("base", timeout=60) as sb:
        gate = tmp_path / "gate"
        job = sb.start(
            f"echo out1; echo err1 >&2; while [ ! -f {gate} ]; do sleep 0.05; done; echo $PWD; exit 3",
            env={"X": "1"},
            cwd=str(tmp_path),
        )
        assert job.poll() is None
        gate.write_text("go")
        assert wait_until(lambda: job.poll() is not None, 10)
        res = job.poll()
        assert (res.exit_code, res.stderr) == (3, "err1\n")
        assert res.stdout == f"out1\n{tmp_path}\n"

        job2 = sb.start(f"echo $$ > {tmp_path}/pid2; sleep 30")
        assert wait_until(lambda: (tmp_path / "pid2").exists(), 5)
        pid = int((tmp_path / "pid2").read_text())
        assert job2.poll() is None
        job2.kill()
        res2 = job2.poll()
        assert res2 is not None and res2.exit_code == 137
        assert wait_until(lambda: not _alive(pid), 5)


def test_background_job_survives_until_sandbox_kill(fake, provider, tmp_path):
    sb = provider.create("base", timeout=60)
    sb.start(f"echo $$ > {tmp_path}/pid; sleep 30")
    assert wait_until(lambda: (tmp_path / "pid").exists(), 5)
    pid = int((tmp_path / "pid").read_text())
    assert _alive(pid)
    sb.kill()
    assert wait_until(lambda: not _alive(pid), 5)


def test_files_write_and_read(provider, tmp_path):
    blob = bytes(range(256)) * 3
    with provider.create("base", timeout=60) as sb:
        sb.write_file(str(tmp_path / "deep/dir/blob.bin"), blob)
        sb.write_file("notes.txt", "héllo\n")
        assert sb.read_file(str(tmp_path / "deep/dir/blob.bin")) == blob
        assert sb.read_file("notes.txt") == "héllo\n".encode()
        assert sb.run("cat notes.txt", timeout=10).stdout == "héllo\n"
        with pytest.raises(SandboxError, match="missing.txt"):
            sb.read_file("missing.txt")


def test_token_is_written_for_the_server_and_egress_is_ignored(fake, provider):
    with provider.create("base", timeout=60, egress="127.0.0.1:9") as sb:
        assert sb.egress_url is None and len(sb.blackbox_token) >= 40
        assert sb.read_file("/run/sweflow/blackbox.token").decode() == sb.blackbox_token
        assert (fake.envd.sandboxes[sb.id].workdir / "run/sweflow/blackbox.token").exists(), (
            "never the host's /run"
        )
        assert "SWEFLOW_BLACKBOX_TOKEN" not in sb.run("env", timeout=10).stdout
    with provider.create("base", timeout=60) as other:
        assert other.blackbox_token != sb.blackbox_token


def test_run_logged_is_the_trusted_channel(provider, tmp_path):
    with provider.create("base", timeout=120) as sb:
        log = tmp_path / "eval.log"
        r = sb.run_logged("echo out; echo err >&2; exit 3", str(log), timeout=30)
        assert (r.exit_code, r.timed_out, r.stdout, r.stderr) == (3, False, "", "")
        assert sorted(log.read_text().splitlines()) == ["err", "out"]
        # a daemon holding the pipe is killed once the command ended: the call returns, LATE never lands
        log2 = tmp_path / "daemon.log"
        t0 = time.monotonic()
        r = sb.run_logged("(sleep 3; echo LATE) & echo early; exit 0", str(log2), timeout=30)
        assert r.exit_code == 0 and time.monotonic() - t0 < 10
        time.sleep(3.5)
        assert log2.read_text() == "early\n"
        log3 = tmp_path / "forge.log"
        r = sb.run_logged("echo FAILED; echo 0 > rc; exit 1", str(log3), timeout=30)
        assert r.exit_code == 1 and log3.read_text() == "FAILED\n"
        log4 = tmp_path / "big.log"
        r = sb.run_logged("head -c 5000 /dev/zero | tr '\\0' x", str(log4), timeout=30, max_bytes=1000)
        text = log4.read_text()
        assert r.exit_code == 0 and text.startswith("x" * 1000) and "truncated" in text and len(text) < 1200
        t0 = time.monotonic()
        r = sb.run_logged("echo start; sleep 60", str(tmp_path / "slow.log"), timeout=2)
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 20


def test_port_url_uses_sandbox_host_and_scheme(provider):
    with provider.create("base", timeout=60) as sb:
        # the fake's sandbox URL is plain http, so the port URL is too
        assert sb.port_url(31000) == f"http://31000-{sb.id}.fake.e2b.test"


def test_create_retries_5xx_then_succeeds(fake, provider):
    fake.control.fail("create", times=2, status=500)
    with provider.create("base", timeout=60) as sb:
        assert sb.run("echo up", timeout=10).stdout == "up\n"
    assert fake.control.count("create") == 3


def test_create_persistent_5xx_raises_after_attempts(fake, provider):
    fake.control.fail("create", times=10, status=503)
    with pytest.raises(SandboxError) as err:
        provider.create("base", timeout=60)
    assert "after 3 attempts" in str(err.value) and "'base'" in str(err.value)
    assert fake.control.count("create") == 3  # the SDK's own retries are off: this module owns the policy
    assert not fake.control.sandboxes


def test_slow_create_times_out(fake):
    provider = E2BProvider(**fake.api_params(), request_timeout=0.5, attempts=2, backoff=0.01)
    fake.control.fail("create", times=5, status=0, delay=2.0)
    t0 = time.monotonic()
    with pytest.raises(SandboxError, match="(?i)timeout|timed out"):
        provider.create("base", timeout=60)
    assert time.monotonic() - t0 < 8
    assert fake.control.count("create") == 2


def test_slow_create_then_retry_reuses_idempotency_key(fake):
    provider = E2BProvider(**fake.api_params(), request_timeout=0.5, backoff=0.01)
    fake.control.fail("create", times=1, status=0, delay=1.5)  # answered too late, but created
    with provider.create("base", timeout=60) as sb:
        assert sb.run("echo once", timeout=10).stdout == "once\n"
        assert fake.control.count("create") == 2
        assert list(fake.control.sandboxes) == [sb.id]  # no twin sandbox


def test_unknown_template_is_a_clear_error_without_retries(fake, provider):
    with pytest.raises(SandboxError) as err:
        provider.create("no-such-template", timeout=60)
    msg = str(err.value)
    assert "no-such-template" in msg and "not found" in msg and "\n" not in msg
    assert fake.control.count("create") == 1


def test_bad_api_key_is_not_retried(fake):
    provider = E2BProvider(
        "e2b_wrong_key_0000000000", api_url=fake.control.url, sandbox_url=fake.envd.url, backoff=0.01
    )
    with pytest.raises(SandboxError, match="(?i)unauthorized|credentials"):
        provider.create("base", timeout=60)
    assert fake.control.count("create") == 1


def test_configuration_from_environment(fake, monkeypatch):
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    provider = E2BProvider(backoff=0.01)
    with provider.create("base", timeout=60) as sb:
        assert sb.run("echo env", timeout=10).stdout == "env\n"
        assert sb.port_url(8080).startswith("http://8080-")


def test_api_key_never_appears_in_logs_or_errors(fake, caplog, capfd):
    assert FAKE_API_KEY.startswith("e2b_test_SECRET_")
    caplog.set_level(logging.DEBUG)
    provider = E2BProvider(**fake.api_params(), request_timeout=0.5, attempts=2, backoff=0.01)
    texts = [repr(provider)]
    with provider.create("base", timeout=60) as sb:
        texts.append(repr(sb.run("echo $E2B_API_KEY; exit 2", timeout=10)))
        texts.append(repr(sb.run("sleep 5", timeout=0.5)))
    fake.control.fail("create", times=2, status=500)
    fake.control.fail("create", times=2, status=0, delay=1.5)
    for template in ("base", "base", "missing"):
        with pytest.raises(SandboxError) as err:
            provider.create(template, timeout=60)
        texts.append(str(err.value))
    out, errout = capfd.readouterr()
    assert FAKE_API_KEY in fake.control.seen_api_keys  # the key did travel, in its header
    for text in [*texts, caplog.text, out, errout]:
        assert FAKE_API_KEY not in text


# -- template builds ----------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path):
    claude = tmp_path / "bin" / "claude-native"
    claude.parent.mkdir()
    claude.write_bytes(b"#!/bin/sh\necho fake claude\n")
    wheel = tmp_path / "dist" / "sweflow-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK fake wheel bytes")
    return {
        "image": "sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-1:latest",
        "packages": ["git", "patch"],
        "claude_binary": str(claude),
        "runtime_wheel": str(wheel),
    }


def _uploaded_members(fake) -> dict[str, bytes]:
    members = {}
    for blob in fake.control.uploads.values():
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    members[m.name] = tar.extractfile(m).read()
    return members


def test_template_build_through_the_sdk_builder(fake, provider, inputs):
    logs: list[str] = []
    rec = provider.build_template(
        inputs, "sweflow-calclib-1", cpu_count=2, memory_mb=1024, poll_interval=0.05, on_log=logs.append
    )
    assert (rec.provider, rec.template, rec.image) == ("e2b", "sweflow-calclib-1", inputs["image"])
    build = fake.control.builds[rec.build_id]
    assert (build.cpu_count, build.memory_mb, build.status) == (2, 1024, "ready")
    assert rec.extra["template_id"] == build.template_id
    assert rec.spec_hash == template_inputs(inputs).spec_hash()  # the provider-neutral spec hash
    spec = build.spec
    assert spec["fromImage"] == inputs["image"]
    assert spec["startCmd"] == DEFAULT_START_CMD
    assert "http://127.0.0.1:31000/health" in spec["readyCmd"]
    kinds = [(s["type"], s["args"]) for s in spec["steps"]]
    assert kinds[0] == ("USER", ["root"])
    assert kinds[1][0] == "RUN" and "git patch python3 python3-venv curl" in kinds[1][1][0]
    assert kinds[2] == ("COPY", ["claude", "/usr/local/bin/claude", "", "0755"])
    assert kinds[3][0] == "COPY" and kinds[3][1][1].endswith("/sweflow-0.1.0-py3-none-any.whl")
    assert "python3 -m venv /opt/sweflow/runtime" in kinds[4][1][0] and "--no-deps" in kinds[4][1][0]
    members = _uploaded_members(fake)
    assert members["claude"] == Path(inputs["claude_binary"]).read_bytes()
    assert members["sweflow-0.1.0-py3-none-any.whl"] == b"PK fake wheel bytes"
    assert any("finalize" in line for line in logs)
    # the built template can be used right away
    with provider.create("sweflow-calclib-1", timeout=60) as sb:
        assert sb.run("echo from-template", timeout=10).ok


def test_template_build_failure_names_image_and_step(fake, provider, inputs):
    fake.control.fail_build_on = "pip install"
    with pytest.raises(SandboxError) as err:
        provider.build_template(inputs, "broken", poll_interval=0.05)
    msg = str(err.value)
    assert inputs["image"] in msg and "exit status 1" in msg
    assert "field 'step 5 (RUN set -e; /usr/bin/python3 -m venv" in msg


def test_template_build_request_5xx_is_retried(fake, provider, inputs):
    fake.control.fail("build_request", times=1, status=502)
    fake.control.fail("build_status", times=1, status=500)
    rec = provider.build_template(inputs, "retried", poll_interval=0.05)
    assert fake.control.builds[rec.build_id].status == "ready"
    assert fake.control.count("build_request") == 2


def test_template_build_missing_input_names_the_file(provider, inputs):
    inputs["runtime_wheel"] = "/nonexistent/sweflow-0.1.0-py3-none-any.whl"
    with pytest.raises(SandboxError, match="/nonexistent/sweflow-0.1.0-py3-none-any.whl"):
        provider.build_template(inputs, "x", poll_interval=0.05)


def test_fake_serves_the_sdk_template_build_flow(fake, inputs, tmp_path, monkeypatch):
    """Template.build itself (not only the provider's background + status calls) works on the fake."""
    from e2b import BuildException, Template

    from sweflow.sandbox.e2b_template import e2b_template_from_spec

    tpl = e2b_template_from_spec(inputs, context_dir=tmp_path / "ctx")
    monkeypatch.setattr(Template, "_logs_refresh_frequency", 0.05)
    info = Template.build(tpl, "direct-build", cpu_count=1, memory_mb=512, **fake.api_params())
    assert fake.control.builds[info.build_id].status == "ready"
    fake.control.fail_build_on = "apt-get"
    with pytest.raises(BuildException, match="apt-get"):
        Template.build(tpl, "direct-build-2", **fake.api_params())


def test_pipeline_build_template_with_the_e2b_provider(fake, provider, inputs):
    """sweflow.sandbox.build (the build_template rule's entry) drives this provider with a TemplateSpec."""
    from sweflow.sandbox.build import build_template

    spec = TemplateSpec(
        image=inputs["image"],
        claude_binary=Path(inputs["claude_binary"]),
        runtime_wheel=Path(inputs["runtime_wheel"]),
        cpu=1,
        memory_mb=512,
    )
    rec = build_template(provider, spec.image, spec=spec, attempts=1)
    assert rec.spec_hash == spec.spec_hash() and rec.provider == "e2b"
    build = fake.control.builds[rec.build_id]
    assert (build.cpu_count, build.memory_mb, build.name) == (1, 512, rec.template)
    fake.control.fail_build_on = "apt-get"
    with pytest.raises(SandboxError, match="step 2 \\(RUN apt-get update"):
        build_template(provider, spec.image, spec=spec, name="other", attempts=1)
