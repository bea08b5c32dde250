"""`sweflow.sandbox.local._kill_group`: the host (root) kills a sandbox command's process group by the
leader's pid, so it must never do so once the leader is reaped: that pid, and with it the group id, may be
another process's by then (a new sandbox's holder, say, which leads its own group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sweflow.sandbox import local


def _group_leader(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(list(argv), start_new_session=True)


def test_a_live_group_is_killed_with_its_members():
    # the leader forks a member that outlives it unless the group is killed
    proc = _group_leader(sys.executable, "-c", "import os, time; os.fork(); time.sleep(60)")
    time.sleep(0.3)
    members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == proc.pid]
    assert len(members) == 2, members
    local._kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in members) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in members)


def test_a_reaped_leader_is_never_signalled_by_its_old_pid(monkeypatch):
    proc = _group_leader("true")
    proc.wait()
    sent = []
    monkeypatch.setattr(local.os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    local._kill_group(proc)
    assert sent == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
