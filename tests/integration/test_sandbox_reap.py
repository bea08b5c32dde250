"""Reaping a killed run's sandboxes: a real sandbox is created in a child process that is then SIGKILLed
(its cleanup never runs); the reaper removes what the ledger recorded, and nothing else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sweflow.sandbox import ledger

# The module-scoped fixtures that build a real template (local: from the sample repo; docker: full image).
from tests.integration.test_sandbox_docker import env as docker_env  # noqa: F401
from tests.integration.test_sandbox_local import local  # noqa: F401

pytestmark = [pytest.mark.integration]

CHILD = textwrap.dedent(
    """
    import sys, time
    from sweflow.sandbox.registry import get_provider
    kind, template = sys.argv[1], sys.argv[2]
    opts = {"templates_root": sys.argv[3]} if kind == "local" else {}
    sb = get_provider(kind, **opts).create(template, timeout=600)
    sb.start("sleep 600")
    print(sb.id, getattr(sb, "dir", ""), flush=True)
    time.sleep(600)
    """
)


def _child(workdir: Path, kind: str, template: str, root: str = "") -> tuple[subprocess.Popen, str, str]:
    env = {k: v for k, v in os.environ.items() if k != ledger.LEDGER_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, template, root],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().split()
    assert line, "the child did not create its sandbox"
    return proc, line[0], line[1] if len(line) > 1 else ""


def _entries(workdir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((workdir / ".sweflow" / "sandboxes").glob("*.json"))]


def _sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_killed_runs_local_sandbox_is_reaped(local, tmp_path):  # noqa: F811
    provider, template, _ = local
    proc, sid, folder = _child(tmp_path, "local", template, str(provider.root))
    assert [(e["provider"], e["id"], e["pid"]) for e in _entries(tmp_path)] == [("local", sid, proc.pid)]
    assert ledger._pids_using(folder), "the sandbox's processes should be running"
    _sigkill(proc)
    assert Path(folder).is_dir()  # the child's cleanup never ran
    lines: list[str] = []
    report = ledger.reap(tmp_path, say=lines.append)
    assert report.reaped == [f"local sandbox {sid}"] and report.failed == []
    assert lines[0].startswith(f"reaped local sandbox {sid} (left by pid {proc.pid}): killed ")
    assert not Path(folder).exists()
    assert ledger._pids_using(folder) == []
    assert _entries(tmp_path) == []


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_a_running_pipelines_sandbox_is_left_alone(local, tmp_path):  # noqa: F811
    provider, template, _ = local
    proc, sid, folder = _child(tmp_path, "local", template, str(provider.root))
    try:
        report = ledger.reap(tmp_path, say=lambda _line: None)
        assert report.reaped == [] and report.alive == [f"local sandbox {sid}"]
        assert Path(folder).is_dir() and ledger._pids_using(folder)
    finally:
        _sigkill(proc)
    assert ledger.reap(tmp_path, say=lambda _line: None).reaped == [f"local sandbox {sid}"]


@pytest.mark.docker
def test_killed_runs_container_is_reaped_and_a_foreign_one_is_not(docker_env, tmp_path):  # noqa: F811
    client = docker_env["client"]
    # Same image and same sweflow label as ours, but not in the ledger: never touched.
    foreign = client.containers.run(
        docker_env["task_image"], ["sleep", "600"], detach=True, network_mode="none",
        labels={"sweflow.sandbox": "1", "sweflow.template": docker_env["template"]},
    )  # fmt: skip
    try:
        proc, sid, _ = _child(tmp_path, "docker", docker_env["template"])
        [entry] = _entries(tmp_path)
        cid = entry["details"]["container"]
        assert cid.startswith(sid) and client.containers.get(cid).status == "running"
        _sigkill(proc)
        assert client.containers.get(cid).status == "running"  # nobody removed it
        report = ledger.reap(tmp_path, say=lambda _line: None)
        assert report.reaped == [f"docker sandbox {sid}"] and report.failed == []
        deadline = time.monotonic() + 30
        ids = {c.id for c in client.containers.list(all=True)}
        while cid in ids and time.monotonic() < deadline:
            time.sleep(0.5)
            ids = {c.id for c in client.containers.list(all=True)}
        assert cid not in ids
        assert foreign.id in ids and client.containers.get(foreign.id).status == "running"
        assert _entries(tmp_path) == []
    finally:
        foreign.remove(force=True)
