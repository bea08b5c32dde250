"""The Docker backend against the real engine: debootstrap base, task image, template build, sandboxes, smoke.

The first run is slow (debootstrap, Claude Code download); both are cached under $SWEFLOW_CACHE
(default ~/.cache/sweflow), so reruns only rebuild the template when the sweflow sources changed.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest

from sweflow.errors import SandboxError
from sweflow.sandbox.base import BLACKBOX_PORT
from sweflow.sandbox.build import build_and_record
from sweflow.sandbox.smoke import smoke
from sweflow.sandbox.spec import TemplateSpec, template_name
from tests.fakes.e2b_envd import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.docker]
CLAUDE_VERSION = os.environ.get("SWEFLOW_CLAUDE_VERSION", "2.1.332")


def _docker_or_skip():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Docker engine: {exc}")
    return client


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    client = _docker_or_skip()
    from sweflow.sample import materialize_repo, sample_rows
    from sweflow.sandbox.artifacts import artifact_paths, prepare_artifacts
    from sweflow.sandbox.docker import DockerProvider
    from sweflow.sandbox.images import build_base_image, build_sample_images, cache_dir

    tmp = tmp_path_factory.mktemp("docker")
    build_base_image()
    art_dir = cache_dir().parent / "artifacts" / CLAUDE_VERSION
    manifest = prepare_artifacts(art_dir, CLAUDE_VERSION)
    paths = artifact_paths(art_dir, manifest)
    info = materialize_repo(tmp / "calclib")
    row = sample_rows("train")[0]
    [task_image] = build_sample_images([row], repo_path=info.path)
    spec = TemplateSpec(image=task_image, claude_binary=paths["claude"], runtime_wheel=paths["wheel"])
    provider = DockerProvider()
    rec = build_and_record(provider, task_image, tmp / "record.json", spec=spec, attempts=2, backoff=1)
    assert rec["ok"], rec
    return {"client": client, "host": provider, "none": DockerProvider(start_server=False), "template": rec["template"],
            "task_image": task_image, "row": row, "tmp": tmp, "spec": spec, "record": rec}  # fmt: skip


def test_base_and_task_image_layout(env):
    """A plain task image (CMD bash) works as a sandbox too: nothing is served, the keep-alive runs."""
    row = env["row"]
    with env["none"].create(env["task_image"], timeout=120) as sb:
        r = sb.run(
            "git rev-parse HEAD; git remote | wc -l; source /opt/miniconda3/bin/activate && conda activate testbed"
            " && which python && python -m pytest --version 2>&1 | head -1",
            timeout=60,
        )
        assert r.ok, r
        lines = r.stdout.splitlines()
        assert lines[:3] == [row["base_commit"], "0", "/opt/miniconda3/envs/testbed/bin/python"]
        assert lines[3].startswith("pytest ")


def test_template_has_claude_isolated_runtime_and_record(env):
    rec = env["record"]
    assert rec["template"] == template_name(env["task_image"]) and rec["spec_hash"] == env["spec"].spec_hash()
    assert rec["digest"].startswith("sha256:")
    arts = rec["extra"]["artifact_images"]
    assert sorted(arts) == sorted([env["spec"].claude_binary.name, env["spec"].runtime_wheel.name])
    assert all(env["client"].images.get(tag) for tag in arts.values())
    with env["none"].create(env["template"], timeout=120) as sb:
        r = sb.run("claude --version", timeout=60)
        assert r.ok and r.stdout.startswith(CLAUDE_VERSION), r
        r = sb.run("/opt/sweflow/runtime/bin/python -c 'import sweflow.blackbox, sweflow; print(sweflow.__file__)'",
                   timeout=60)  # fmt: skip
        assert r.ok and r.stdout.startswith("/opt/sweflow/runtime/lib/"), r
        r = sb.run("source /opt/miniconda3/bin/activate; conda activate testbed; python -c 'import sweflow'",
                   timeout=60)  # fmt: skip
        assert r.exit_code == 1 and "No module named 'sweflow'" in r.stderr, (
            "the task's python stays untouched"
        )


def test_run_env_cwd_timeout_files_background(env):
    with env["none"].create(env["template"], timeout=300, env={"FOO": "bar"}) as sb:
        r = sb.run("pwd; echo $FOO $BAZ; echo err >&2; exit 5", timeout=30, env={"BAZ": "qux"})
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (5, "/testbed\nbar qux\n", "err\n", False)
        assert sb.run("pwd", timeout=30, cwd="/tmp").stdout == "/tmp\n"
        t0 = time.monotonic()
        r = sb.run("(sleep 30; touch /tmp/late) & sleep 30", timeout=2)
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 15
        assert sb.run("sleep 0.5; test -e /tmp/late || echo absent", timeout=10).stdout == "absent\n"
        blob = bytes(range(256)) * 1000
        sb.write_file("/tmp/a/b/blob.bin", blob)
        assert sb.read_file("/tmp/a/b/blob.bin") == blob
        sb.write_file("/testbed/new.txt", "héllo")
        assert sb.run("cat /testbed/new.txt", timeout=10).stdout == "héllo"
        with pytest.raises(SandboxError, match="read_file"):
            sb.read_file("/tmp/nope")
        bg = sb.start("echo hi; sleep 0.5; echo bye >&2; exit 4")
        deadline = time.monotonic() + 30
        while (res := bg.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert res is not None and (res.exit_code, res.stdout, res.stderr) == (4, "hi\n", "bye\n")
        long = sb.start("sleep 120")
        assert long.poll() is None
        long.kill()
        assert wait_until(lambda: long.poll() is not None, timeout=30)  # a loaded machine may take a while
        assert long.poll().exit_code == 137 and "sleep 120" not in sb.run("ps -eo args", timeout=10).stdout


def test_kill_removes_container_and_lifetime_timeout(env):
    import docker

    sb = env["none"].create(env["template"], timeout=300, metadata={"purpose": "kill-test"})
    cid = sb.container.id
    assert env["client"].containers.get(cid).labels["sweflow.meta.purpose"] == "kill-test"
    sb.kill()
    sb.kill()
    with pytest.raises(docker.errors.NotFound):
        env["client"].containers.get(cid)
    with pytest.raises(SandboxError, match="already killed"):
        sb.run("true", timeout=5)
    short = env["none"].create(env["template"], timeout=1)

    def gone() -> bool:
        try:
            env["client"].containers.get(short.container.id)
        except docker.errors.NotFound:
            return True
        return False

    # the lifetime timer kills it and removes the container: waited for, not slept on (a loaded machine)
    assert wait_until(lambda: short.killed and gone(), timeout=30)


def test_resource_limits_are_applied_and_enforced(env):
    from sweflow.sandbox.docker import DockerProvider

    p = DockerProvider(cpu=1, memory_mb=256, pids_limit=64, start_server=False)
    with p.create(env["task_image"], timeout=120) as sb:
        hc = env["client"].containers.get(sb.container.id).attrs["HostConfig"]
        assert (hc["NanoCpus"], hc["Memory"], hc["PidsLimit"]) == (10**9, 256 * 2**20, 64)
        r = sb.run("python3 -c 'b = bytearray(600 * 2**20); print(len(b))'", timeout=60)
        assert r.exit_code == 137 and not r.stdout, "the memory limit kills the allocation"
        assert sb.run("echo alive", timeout=10).stdout == "alive\n"


def test_file_size_and_disk_limits(env):
    """A 4 MB patch that expands to 512 MiB, or a sandbox filling the host's disk: every file is capped,
    and the writable layer is where the storage driver can (else the provider measures it and kills the
    sandbox past the cap)."""
    from sweflow.sandbox.docker import DockerProvider

    p = DockerProvider(memory_mb=512, file_size_mb=16, disk_mb=64, start_server=False)
    with p.create(env["task_image"], timeout=120) as sb:
        hc = env["client"].containers.get(sb.container.id).attrs["HostConfig"]
        assert {u["Name"]: u["Hard"] for u in hc["Ulimits"]} == {"core": 0, "fsize": 16 * 2**20}
        assert (hc.get("StorageOpt") or {}).get("size") == ("64M" if p._disk_opt_ok else None)
        r = sb.run(
            "head -c 20M /dev/zero > /testbed/big.bin; echo rc=$?; stat -c %s /testbed/big.bin", timeout=60
        )
        assert "rc=0" not in r.stdout and r.stdout.split()[-1] == str(16 * 2**20), r
        assert sb.run("echo alive", timeout=10).stdout == "alive\n"
        # many files under the per-file cap: the layer's size stops them (where the driver caps it) or
        # the provider's measurement kills the sandbox (where it cannot)
        cmd = "for i in 1 2 3 4 5 6; do head -c 15M /dev/zero > /testbed/f$i || echo full; done; sleep 30"
        try:
            r = sb.run(cmd, timeout=60)
        except SandboxError:
            r = None  # killed while it ran
        if p._disk_opt_ok:
            assert r is not None and "full" in r.stdout + r.stderr, r
        else:
            deadline = time.monotonic() + 30
            while not sb.killed and time.monotonic() < deadline:
                time.sleep(0.5)
            assert sb.killed and sb.disk_exceeded, "killed past its disk cap"


def test_smoke_reaches_the_server_from_the_host(env):
    result = smoke(env["host"], env["template"])
    assert result["ok"] and result["host_reachable"] and result["template"] == env["template"]
    assert "version" in result["status_keys"] and result["version"]


def test_containers_are_locked_down(env):
    with env["host"].create(env["template"], timeout=120) as sb:
        hc = env["client"].containers.get(sb.container.id).attrs["HostConfig"]
        assert hc["NetworkMode"] == "none" and hc["CapDrop"] == ["ALL"] and not hc["CapAdd"]
        assert hc["SecurityOpt"] == ["no-new-privileges"] and not hc["Privileged"]
        assert (hc["NanoCpus"], hc["Memory"], hc["PidsLimit"]) == (2 * 10**9, 4096 * 2**20, 1024)
        assert [m.split(":")[1] for m in hc["Binds"]] == ["/run/sweflow"]
        env_list = env["client"].containers.get(sb.container.id).attrs["Config"]["Env"]
        assert not any(e.startswith("SWEFLOW_BLACKBOX_TOKEN") for e in env_list)
        assert "SWEFLOW_BLACKBOX_TOKEN" not in sb.run("env", timeout=10).stdout


def test_the_blackbox_token_is_nowhere_the_sandbox_can_read(env):
    """Not in any process's /proc environ or command line (the exec wrapper's included), nor in a file."""
    with env["host"].create(env["template"], timeout=120) as sb:
        # the keep-alive and its forwarder are recorded (PID 1's children file ends in a space: the pid
        # was read as "7 ", nothing resolved, and every create waited 5 s for it)
        keep, *forwarders = sb.base_pids.split()
        assert forwarders and sb.run(f"cat /proc/{keep}/comm", timeout=10).stdout.strip() == "sleep"
        url = sb.port_url(BLACKBOX_PORT)
        deadline = time.monotonic() + 30
        while True:  # the server answers with the token it took from its file
            try:
                req = urllib.request.Request(
                    url + "/v1/status", headers={"Authorization": f"Bearer {sb.blackbox_token}"}
                )
                with urllib.request.urlopen(req, timeout=2) as resp:
                    assert "version" in json.loads(resp.read())
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.3)
        token = sb.blackbox_token
        half = len(token) // 2  # the search's own command line holds the token in two halves only
        scan = (
            f"import glob, os\nt = {token[:half]!r} + {token[half:]!r}\nhits = []\n"
            "for f in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    try:\n        data = open(f, 'rb').read()\n    except OSError:\n        continue\n"
            "    if t.encode() in data:\n        hits.append(f)\n"
            "for top in ('/run', '/tmp', '/root', '/etc'):\n"
            "    for d, _, names in os.walk(top):\n        for n in names:\n"
            "            try:\n                if t.encode() in open(os.path.join(d, n), 'rb').read():\n"
            "                    hits.append(os.path.join(d, n))\n"
            "            except OSError:\n                pass\n"
            "print(len(hits), *hits)\n"
        )
        sb.write_file("/opt/scan.py", scan)
        r = sb.run("python3 /opt/scan.py", timeout=60)
        assert r.stdout.split()[:1] == ["0"], r
        assert sb.run("ls /run | grep -c sweflow-token", timeout=60).stdout.strip() == "0"


def test_each_sandbox_gets_its_own_host_route(env):
    with (
        env["host"].create(env["template"], timeout=120) as a,
        env["host"].create(env["template"], timeout=120) as b,
    ):
        urls = {a.port_url(BLACKBOX_PORT), b.port_url(BLACKBOX_PORT)}
        assert len(urls) == 2
        for sb in (a, b):
            url = sb.port_url(BLACKBOX_PORT)
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                        assert json.loads(resp.read())["healthy"] is True
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.3)
            req = urllib.request.Request(
                url + "/v1/status", headers={"Authorization": f"Bearer {sb.blackbox_token}"}
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert "version" in json.loads(resp.read())
        assert a.blackbox_token != b.blackbox_token
        with pytest.raises(SandboxError, match="not reachable from the host"):
            a.port_url(8080)
    with env["none"].create(env["template"], timeout=120) as c:
        with pytest.raises(SandboxError, match="not reachable from the host"):
            c.port_url(BLACKBOX_PORT)


def test_run_logged_is_the_trusted_channel(env, tmp_path):
    with env["none"].create(env["template"], timeout=300) as sb:
        log = tmp_path / "eval.log"
        r = sb.run_logged("echo out; echo err >&2; exit 3", str(log), timeout=30)
        assert (r.exit_code, r.timed_out, r.stdout, r.stderr) == (3, False, "", "")
        assert sorted(log.read_text().splitlines()) == ["err", "out"]
        # a daemon that outlives the command is killed: its late write never lands, the call returns
        log2 = tmp_path / "daemon.log"
        t0 = time.monotonic()
        r = sb.run_logged("(sleep 2; echo LATE) & disown; echo early; exit 0", str(log2), timeout=30)
        assert r.exit_code == 0 and time.monotonic() - t0 < 10
        time.sleep(2.5)
        assert log2.read_text() == "early\n"
    with env["none"].create(env["template"], timeout=300) as sb:
        # the command cannot forge its status or its log through files in the sandbox
        log3 = tmp_path / "forge.log"
        r = sb.run_logged(
            "echo FAILED; : > /proc/self/fd/1 2>/dev/null; echo 0 > /tmp/rc; exit 1", str(log3), timeout=30
        )
        assert r.exit_code == 1 and "FAILED" in log3.read_text()
        log4 = tmp_path / "big.log"
        r = sb.run_logged("head -c 5000 /dev/zero | tr '\\0' x", str(log4), timeout=30, max_bytes=1000)
        text = log4.read_text()
        assert r.exit_code == 0 and text.startswith("x" * 1000) and "truncated" in text and len(text) < 1200
    with env["none"].create(env["template"], timeout=300) as sb:
        t0 = time.monotonic()
        r = sb.run_logged("echo start; sleep 60", str(tmp_path / "slow.log"), timeout=2)
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 20
        assert (tmp_path / "slow.log").read_text() == "start\n"


def test_failed_builds_are_recorded_and_others_still_build(env):
    tmp, task = env["tmp"], env["task_image"]
    jobs = {
        "missing": TemplateSpec(image="sweflow-sample/does-not-exist:latest"),
        "badrun": TemplateSpec(image=task, packages=("sweflow-no-such-package",)),
        "good": TemplateSpec(image=task, env=(("SWEFLOW_TEST_MARK", "1"),)),
    }
    names = {"missing": None, "badrun": "sweflow-test-badrun", "good": "sweflow-test-good"}
    out = {
        k: build_and_record(env["host"], s.image, tmp / f"{k}.json", spec=s, name=names[k], attempts=1)
        for k, s in jobs.items()
    }
    assert out["missing"]["ok"] is False and out["missing"]["image"] == "sweflow-sample/does-not-exist:latest"
    assert out["missing"]["step"] == "FROM" and "not found" in out["missing"]["error"]
    assert out["badrun"]["ok"] is False and out["badrun"]["image"] == task
    assert out["badrun"]["step"].startswith("Step 3/") and "RUN" in out["badrun"]["step"]
    assert task in out["badrun"]["error"]
    assert out["good"]["ok"] is True
    assert json.loads((tmp / "badrun.json").read_text()) == out["badrun"]
    with env["none"].create("sweflow-test-good", timeout=60) as sb:
        assert sb.run("echo $SWEFLOW_TEST_MARK", timeout=30).stdout == "1\n"
    with pytest.raises(SandboxError) as ei:
        smoke(env["none"], "sweflow-test-badrun")
    assert ei.value.file == "sweflow-test-badrun" and ei.value.field == "create"


def test_local_template_from_task_image(env, tmp_path):
    """The local backend exports /testbed from a task image with the docker CLI."""
    from sweflow.sandbox.local import LocalProvider

    local = LocalProvider(tmp_path / "templates", start_server=False, testbed_requirements=())
    rec = local.build(TemplateSpec(image=env["task_image"]), "from-image")
    assert rec.template == "from-image"
    with local.create("from-image", timeout=60) as sb:
        assert sb.run("git rev-parse HEAD", timeout=30).stdout.strip() == env["row"]["base_commit"]
