"""The local (bubblewrap) backend on a real sandbox built from the sample repository."""

from __future__ import annotations

import concurrent.futures as cf
import json
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from sweflow.errors import SandboxError
from sweflow.sandbox.base import BLACKBOX_PORT
from sweflow.sandbox.build import build_and_record
from sweflow.sandbox.local import LocalProvider
from sweflow.sandbox.smoke import smoke
from sweflow.sandbox.spec import TemplateSpec, template_name
from tests.fakes.e2b_envd import wait_until
from tests.integration.conftest import ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> tuple[LocalProvider, str, dict]:
    from sweflow.sample import materialize_repo, sample_rows

    tmp = tmp_path_factory.mktemp("local")
    info = materialize_repo(tmp / "calclib")
    row = sample_rows("train")[0]
    image = f"sweflow-sample/{row['instance_id']}:latest"
    provider = LocalProvider(tmp / "templates")
    rec = build_and_record(
        provider, image, tmp / "record.json", spec=TemplateSpec(image=image), attempts=1,
        repo=info.path, commit=row["base_commit"],
    )  # fmt: skip
    assert rec["ok"], rec
    return provider, rec["template"], row


def test_template_record_and_workspace(local):
    provider, template, row = local
    assert template == template_name(f"sweflow-sample/{row['instance_id']}:latest")
    tb = provider.template_dir(template) / "testbed"
    assert (tb / ".git").is_dir()


def test_run_env_cwd_and_testbed_state(local):
    provider, template, row = local
    with provider.create(template, timeout=120, env={"FOO": "bar"}) as sb:
        r = sb.run(
            "pwd; echo $FOO $BAZ; git rev-parse HEAD; git remote | wc -l", timeout=30, env={"BAZ": "qux"}
        )
        assert r.ok, r
        assert r.stdout.split("\n")[:4] == ["/testbed", "bar qux", row["base_commit"], "0"]
        r = sb.run("pwd", timeout=30, cwd="/tmp")
        assert r.stdout.strip() == "/tmp"
        r = sb.run("echo out; echo err >&2; exit 7", timeout=30)
        assert (r.exit_code, r.stdout, r.stderr, r.ok) == (7, "out\n", "err\n", False)
        # The conda shim and the task's test command work as the eval script uses them.
        r = sb.run(
            "source /opt/miniconda3/bin/activate && conda activate testbed && python -m pytest -rA -q tests 2>&1",
            timeout=120,
        )
        assert "passed" in r.stdout and r.exit_code in (0, 1), r.stdout[-2000:]


def test_a_folder_above_that_loses_search_permission_mid_sandbox_gets_it_back(local):
    """Any pytest that starts makes /tmp/pytest-of-<user> 0700 again (another test, a user's own run): a
    sandbox created before must still run its next command (bwrap resolves binds as the sandbox uid)."""
    import os
    import stat

    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        above = sb.dir.parent.parent  # <templates root>/_sandboxes/<id>: the templates root
        mode = stat.S_IMODE(above.stat().st_mode)
        os.chmod(above, mode & ~stat.S_IXOTH)
        r = sb.run("echo ok", timeout=30)
        assert (r.ok, r.stdout) == (True, "ok\n"), r
        assert above.stat().st_mode & stat.S_IXOTH


def test_timeout_kills_the_command_and_its_children(local):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        t0 = time.monotonic()
        r = sb.run("(sleep 30; echo late > /tmp/late) & sleep 30", timeout=1.5)
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 10
        time.sleep(0.5)
        assert sb.run("test -e /tmp/late || echo absent", timeout=10).stdout.strip() == "absent"
        assert "sleep" not in sb.run("ps -eo comm", timeout=10).stdout


def test_files_roundtrip_and_errors(local):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        blob = bytes(range(256)) * 100
        sb.write_file("/tmp/deep/dir/blob.bin", blob)
        assert sb.read_file("/tmp/deep/dir/blob.bin") == blob
        sb.write_file("/testbed/new.txt", "héllo")
        assert sb.run("cat /testbed/new.txt", timeout=10).stdout == "héllo"
        with pytest.raises(SandboxError, match="read_file failed"):
            sb.read_file("/tmp/missing")
        with pytest.raises(SandboxError, match="write_file failed"):
            sb.write_file("/usr/forbidden.txt", "x")  # host root is read-only


def test_background_poll_and_kill(local):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        bg = sb.start("echo started; sleep 0.3; echo done >&2; exit 3")
        deadline = time.monotonic() + 20
        while (res := bg.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert res is not None and (res.exit_code, res.stdout, res.stderr) == (3, "started\n", "done\n")
        long = sb.start("sleep 60")
        time.sleep(0.3)
        assert long.poll() is None
        long.kill()
        assert long.poll() is not None


def test_kill_stops_processes_removes_sandbox_and_is_idempotent(local):
    provider, template, _ = local
    sb = provider.create(template, timeout=120)
    bg = sb.start("sleep 60")
    sb_dir = sb.dir
    assert sb_dir.is_dir()
    sb.kill()
    sb.kill()
    assert bg.proc.poll() is not None
    assert not sb_dir.exists()
    with pytest.raises(SandboxError, match="already killed"):
        sb.run("true", timeout=5)


def test_lifetime_timeout_kills_the_sandbox(local):
    provider, template, _ = local
    sb = provider.create(template, timeout=1)
    assert wait_until(lambda: sb.killed and not sb.dir.exists(), timeout=30)


def test_concurrent_sandboxes_are_isolated(local):
    provider, template, _ = local

    def one(i: int) -> tuple[str, str, int]:
        with provider.create(template, timeout=120) as sb:
            sb.write_file("/testbed/mine.txt", f"sandbox {i}")
            sb.write_file(f"/tmp/own-{i}", "x")
            sb.run("sleep 0.2", timeout=10)
            seen = sb.run("cat /testbed/mine.txt; echo; ls /tmp | grep -c own-", timeout=10).stdout
            return seen, sb.port_url(BLACKBOX_PORT), sb.blackbox_port

    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, range(4)))
    for i, (seen, _, _) in enumerate(results):
        assert seen == f"sandbox {i}\n1\n", "own testbed and own /tmp"
    assert len({url for _, url, _ in results}) == 4, "each sandbox gets its own blackbox port"
    assert not (provider.template_dir(template) / "testbed" / "mine.txt").exists()


def test_server_port_mapping_and_smoke(local):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        url = sb.port_url(BLACKBOX_PORT)
        assert url == f"http://127.0.0.1:{sb.blackbox_port}"
        with pytest.raises(SandboxError, match="not reachable from the host"):
            sb.port_url(8080)  # only the blackbox server is forwarded
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    health = json.loads(resp.read())
                break
            except OSError:
                assert time.monotonic() < deadline, sb.server.poll()
                time.sleep(0.2)
        assert health["healthy"] is True
        # the server demands the sandbox's token (it got it in its own environment only)
        req = urllib.request.Request(
            url + "/v1/status", headers={"Authorization": f"Bearer {sb.blackbox_token}"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert "version" in json.loads(resp.read())
        assert "SWEFLOW_BLACKBOX_TOKEN" not in sb.run("env", timeout=10).stdout
    result = smoke(provider, template)
    assert result["ok"] and result["template"] == template and result["host_reachable"]
    assert result["version"] == health["version"] and "version" in result["status_keys"]


def test_missing_template_and_smoke_failure_name_the_template(tmp_path):
    provider = LocalProvider(tmp_path)
    with pytest.raises(SandboxError, match="local template not built") as ei:
        provider.create("nope", timeout=10)
    assert ei.value.row == "nope"
    with pytest.raises(SandboxError) as ei:
        smoke(provider, "nope")
    assert ei.value.file == "nope" and ei.value.field == "create"


# A site's umask 077 (the host process's) once made the sandbox folder unsearchable for the sandbox uid: bwrap
# then failed with "Can't find source path .../tmp: Permission denied", a rollout aborted as sandbox_died.
_UMASK_CHILD = """
import json, sys
from pathlib import Path
from sweflow.sample import materialize_repo, sample_rows
from sweflow.sandbox.build import build_and_record
from sweflow.sandbox.local import LocalProvider
from sweflow.sandbox.spec import TemplateSpec
tmp = Path(sys.argv[1])
info = materialize_repo(tmp / "calclib")
row = sample_rows("train")[0]
image = f"sweflow-sample/{row['instance_id']}:latest"
provider = LocalProvider(tmp / "templates")
rec = build_and_record(provider, image, tmp / "record.json", spec=TemplateSpec(image=image), attempts=1,
                       repo=info.path, commit=row["base_commit"])
assert rec["ok"], rec
with provider.create(rec["template"], timeout=120) as sb:
    r = sb.run("umask; echo hi > /tmp/x && cat /tmp/x && test -w /testbed && "
               "/opt/miniconda3/envs/testbed/bin/python -m pytest --version", timeout=60)
    print(json.dumps({"rc": r.exit_code, "out": r.stdout, "err": r.stderr}))
"""


def test_a_restrictive_host_umask_changes_nothing_in_the_sandbox(tmp_path):
    """Template build and sandbox from a process with umask 077: the sandbox starts (with its server: create
    fails when the in-sandbox forwarders cannot start), its commands run with umask 022 and can use /tmp, the workspace and the shared venvs."""
    res = subprocess.run(
        [sys.executable, "-c", _UMASK_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=600,
        umask=0o077, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, got
    assert got["out"].split("\n")[:2] == ["0022", "hi"], got
    assert got["out"].split("\n")[2].startswith("pytest "), got


def test_sandbox_runs_unprivileged_and_sees_only_its_workspace(local):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        r = sb.run("id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ls /", timeout=10)
        lines = r.stdout.split()
        assert lines[:5] == ["65534", "CapEff:", "0000000000000000", "NoNewPrivs:", "1"], r
        assert not {"work", "home", "srv", "mnt"} & set(lines[5:]), lines
        assert sb.run("ls /run", timeout=10).stdout.split() == ["sweflow"]
        r = sb.run("git status --short && touch /testbed/x && echo ok", timeout=30)
        assert r.ok and r.stdout.endswith("ok\n"), r


def test_run_logged_is_the_trusted_channel(local, tmp_path):
    provider, template, _ = local
    with provider.create(template, timeout=120) as sb:
        log = tmp_path / "eval.log"
        r = sb.run_logged("echo out; echo err >&2; exit 3", str(log), timeout=30)
        assert (r.exit_code, r.timed_out, r.stdout, r.stderr) == (3, False, "", "")
        assert log.read_text() == "out\nerr\n"
        # a daemon that outlives the command dies with its pid namespace: its late write never lands
        log2 = tmp_path / "daemon.log"
        r = sb.run_logged("(setsid sh -c 'sleep 1; echo LATE') & disown; echo early", str(log2), timeout=30)
        time.sleep(1.5)
        assert r.exit_code == 0 and log2.read_text() == "early\n"
        # files in the sandbox cannot rewrite the log or the status
        log3 = tmp_path / "forge.log"
        r = sb.run_logged("echo FAILED; : > /proc/self/fd/1; echo 0 > /tmp/rc; exit 1", str(log3), timeout=30)
        assert r.exit_code == 1 and log3.read_text().startswith("FAILED\n")
        log4 = tmp_path / "big.log"
        r = sb.run_logged("head -c 5000 /dev/zero | tr '\\0' x", str(log4), timeout=30, max_bytes=1000)
        text = log4.read_text()
        assert r.exit_code == 0 and text.startswith("x" * 1000) and "truncated" in text and len(text) < 1200
        t0 = time.monotonic()
        r = sb.run_logged("echo start; sleep 60", str(tmp_path / "slow.log"), timeout=1.5)
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - t0 < 10
        assert (tmp_path / "slow.log").read_text() == "start\n"


FORK_STORM = """
import os, signal, time
kids = []
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(kids))
"""


def test_limits_cap_processes_memory_file_size_and_scratch_disk(local):
    """The review's findings: 1,500 processes, 3 GiB of memory and 2 GiB of host disk from one sandbox."""
    from sweflow.sandbox.limits import LimitSpec

    base, template, _ = local
    provider = LocalProvider(
        base.root, limits=LimitSpec(pids=64, memory_mb=256, file_size_mb=16, scratch_mb=24)
    )
    sb = provider.create(template, timeout=300)
    try:
        r = sb.run("ulimit -u; ulimit -f; ulimit -c; df -m /tmp /root | tail -2", timeout=30)
        lines = r.stdout.split("\n")
        assert lines[1:3] == [str(16 * 1024), "0"], r  # bash's ulimit -f counts 1024-byte blocks
        assert sb.limits.pids_capped or lines[0] == "64", r
        if sb.limits.mounts:
            assert all(ln.split()[1] == "24" for ln in lines[3:5]), r.stdout
        # processes: a fork storm stops at the cap, the sandbox stays usable
        r = sb.run(f"python3 -c {shlex.quote(FORK_STORM)}", timeout=60)
        assert 0 < int(r.stdout.split()[-1]) < 64, r
        r = sb.run("echo still here", timeout=60)
        assert r.stdout.strip() == "still here", r
        # one file over the size cap
        r = sb.run(
            "head -c 20M /dev/zero > /testbed/big.bin; echo rc=$?; stat -c %s /testbed/big.bin", timeout=60
        )
        assert "rc=0" not in r.stdout and r.stdout.split()[-1] == str(16 * 1024 * 1024), r
        if sb.limits.mounts:  # scratch: many files under the per-file cap still stop at the tmpfs size
            r = sb.run("for i in 1 2 3; do head -c 10M /dev/zero > /tmp/f$i || echo full; done", timeout=60)
            assert "full" in r.stdout + r.stderr, r
        if sb.limits.memory_capped:  # memory: the allocating process is killed, not the host
            r = sb.run("python3 -c 'b = bytearray(600 * 1024 * 1024); print(len(b))'", timeout=120)
            assert r.exit_code != 0 and "629145600" not in r.stdout, r
        cgroups, mounts = list(sb.limits.cgroups), list(sb.limits.mounts)
    finally:
        sb.kill()
    assert not any(d.exists() for d in cgroups) and not any(m.is_mount() for m in mounts)
