"""The sandbox ledger and the reaper: only recorded leftovers of dead owners are removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweflow.cli import main
from sweflow.sandbox import ledger


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ledger.LEDGER_ENV, raising=False)
    return tmp_path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _owned_by(path: Path, pid: int, **changes: object) -> None:
    entry = json.loads(path.read_text())
    entry.update(pid=pid, **changes)
    path.write_text(json.dumps(entry))


def _entries(workdir: Path) -> list[str]:
    top = workdir / ".sweflow" / "sandboxes"
    return sorted(p.name for p in top.glob("*.json")) if top.is_dir() else []


def _building(workdir: Path, name: str) -> tuple[Path, Path]:
    folder = workdir / "templates" / "_building" / name
    entry = ledger.record("building", "local", name, path=str(folder))
    folder.mkdir(parents=True)
    (folder / "testbed").mkdir()
    (folder / "testbed" / "f.py").write_text("x = 1\n")
    assert entry is not None
    return folder, entry


def test_record_writes_one_entry_and_forget_removes_it(workdir: Path) -> None:
    path = ledger.record("sandbox", "local", "local-0123456789ab", dir="/x/_sandboxes/local-0123456789ab")
    assert path == workdir / ".sweflow" / "sandboxes" / "local-sandbox-local-0123456789ab.json"
    entry = json.loads(path.read_text())
    assert entry["pid"] == os.getpid() and entry["host"] and entry["pid_start"]
    assert entry["details"] == {"dir": "/x/_sandboxes/local-0123456789ab"}
    assert ledger.owner_alive(entry)  # this very process
    ledger.forget(path)
    ledger.forget(path)  # idempotent
    assert _entries(workdir) == []


def test_owner_liveness(workdir: Path) -> None:
    path = ledger.record("sandbox", "e2b", "isb1")
    entry = json.loads(path.read_text())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = {**entry, "pid": child.pid, "pid_start": ledger._start_time(child.pid)}
        assert ledger.owner_alive(alive)
        assert not ledger.owner_alive({**alive, "pid_start": "1"})  # the pid was reused by another process
        assert ledger.owner_alive({**alive, "pid": _dead_pid(), "host": "another-node"})  # cannot tell there
    finally:
        child.kill()
        child.wait()
    assert not ledger.owner_alive({**entry, "pid": child.pid})


def test_reap_removes_a_dead_runs_building_folder_and_leaves_a_live_ones(workdir: Path) -> None:
    dead_folder, dead_entry = _building(workdir, "sweflow_s_calclib-1-0badc0de")
    live_folder, live_entry = _building(workdir, "sweflow_s_calclib-2-1badc0de")
    _owned_by(dead_entry, _dead_pid())
    lines: list[str] = []
    report = ledger.reap(say=lines.append)
    assert not dead_folder.exists() and not dead_entry.exists()
    assert live_folder.is_dir() and live_entry.exists()  # its owner (this process) still runs
    assert report.reaped == ["local building sweflow_s_calclib-1-0badc0de"]
    assert report.alive == ["local building sweflow_s_calclib-2-1badc0de"] and report.failed == []
    assert lines[0].startswith("reaped local building sweflow_s_calclib-1-0badc0de (left by pid ")
    assert lines[-1] == "reaped 1 leftover(s), 0 failed, 1 left to running owners"


def test_reap_kills_the_processes_of_a_dead_runs_local_sandbox(workdir: Path) -> None:
    # A process binding the sandbox folder that outlived its creator (as a bwrap would without its parent).
    folder = workdir / "templates" / "_sandboxes" / "local-00aa11bb22cc"
    (folder / "tmp").mkdir(parents=True)
    entry = ledger.record("sandbox", "local", folder.name, dir=str(folder))
    orphan = subprocess.Popen(["/bin/sh", "-c", 'sleep 300; : "$0"', f"{folder}/tmp"], start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        _owned_by(entry, _dead_pid())
        report = ledger.reap(say=lambda _line: None)
        assert report.reaped == [f"local sandbox {folder.name}"]
        assert orphan.wait(timeout=10) == -9
        assert not folder.exists() and _entries(workdir) == []
        assert bystander.poll() is None  # a process not naming the folder is never touched
    finally:
        for p in (orphan, bystander):
            p.kill()
            p.wait()


def _binding(folder: Path) -> subprocess.Popen:
    """A process whose command line names `folder` (as a local sandbox's bwrap does), in its own session;
    one process (no shell forking a child), returned once its command line shows the folder."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", f"{folder}/tmp"], start_new_session=True
    )
    deadline = time.monotonic() + 30
    while proc.pid not in ledger._pids_using(str(folder)):
        assert time.monotonic() < deadline and proc.poll() is None, "the process did not start"
        time.sleep(0.01)
    return proc


def test_processes_that_appear_after_the_first_scan_are_killed_too(tmp_path, monkeypatch) -> None:
    # One forked into a new session after the reaper's first look (so the first group kill misses it).
    folder = tmp_path / "local-00aa11bb22cc"
    (folder / "tmp").mkdir(parents=True)
    first, late = _binding(folder), _binding(folder)
    real, calls = ledger._pids_using, []

    def scan(f):
        calls.append(f)
        found = real(f)
        return [p for p in found if p != late.pid] if len(calls) == 1 else found

    monkeypatch.setattr(ledger, "_pids_using", scan)
    try:
        assert ledger._kill_processes(str(folder), timeout=20) == 2
        assert first.wait(timeout=10) == -9 and late.wait(timeout=10) == -9
        assert real(str(folder)) == []
    finally:
        for p in (first, late):
            p.kill()
            p.wait()


def test_processes_that_will_not_die_are_an_error_not_a_success(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "local-00aa11bb22cc"
    (folder / "tmp").mkdir(parents=True)
    proc = _binding(folder)
    try:
        with monkeypatch.context() as m:
            m.setattr(os, "killpg", lambda *_a: None)  # the signal never lands
            m.setattr(os, "kill", lambda *_a: None)
            with pytest.raises(OSError, match="still running after"):
                ledger._kill_processes(str(folder), timeout=0.3)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_tampered_or_unreadable_entries_are_reported_never_followed(workdir: Path) -> None:
    precious = workdir / "precious"
    precious.mkdir()
    entry = ledger.record("building", "local", "x", path=str(precious))  # not under _building/
    _owned_by(entry, _dead_pid())
    bad_cid = ledger.record("container", "docker", "sweflow-foo", container="sweflow-*")
    _owned_by(bad_cid, _dead_pid())
    (workdir / ".sweflow" / "sandboxes" / "junk.json").write_text("[1, 2]")
    report = ledger.reap(say=lambda _line: None)
    assert precious.is_dir() and entry.exists() and bad_cid.exists()
    assert report.reaped == [] and len(report.failed) == 3
    assert any("refusing to remove" in f and "precious" in f for f in report.failed)
    assert any("not a container id" in f for f in report.failed)


def test_e2b_entry_without_key_is_reported_not_fatal(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    entry = ledger.record("sandbox", "e2b", "i2x9sandboxid", domain="")
    _owned_by(entry, _dead_pid())
    report = ledger.reap(say=lambda _line: None)
    assert report.failed == [
        "e2b sandbox i2x9sandboxid: E2B_API_KEY is not set; cannot kill it (it ends at its lifetime timeout)"
    ]
    assert entry.exists()  # tried again next run


def test_reap_on_start_is_silent_and_cheap_without_entries(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.perf_counter()
    assert ledger.reap_on_start() is None
    (workdir / ".sweflow" / "sandboxes").mkdir(parents=True)
    assert ledger.reap_on_start() is None
    assert time.perf_counter() - t0 < 0.05
    assert capsys.readouterr().err == ""
    folder, entry = _building(workdir, "t-00000000")
    _owned_by(entry, _dead_pid())
    assert ledger.reap_on_start().reaped == ["local building t-00000000"]
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "sweflow reap: reaped 1 leftover(s), 0 failed, 0 left to running owners"


def test_cli_reap(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, entry = _building(workdir, "t-11111111")
    _owned_by(entry, _dead_pid())
    assert main(["reap", "-d", str(workdir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("reaped local building t-11111111") and not folder.exists()
    assert out[-1] == "reaped 1 leftover(s), 0 failed, 0 left to running owners"
    bad = ledger.record("building", "local", "y", path="/etc")
    _owned_by(bad, _dead_pid())
    assert main(["reap"]) == 1
    assert "FAILED local building y: refusing to remove '/etc'" in capsys.readouterr().out
