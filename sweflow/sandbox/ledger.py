"""A ledger of what the pipeline creates outside its outputs (sandboxes, template build folders, build
containers), so that the leftovers of a killed run can be reaped by their recorded ids.

One JSON file per item under `<working dir>/.sweflow/sandboxes/` ($SWEFLOW_LEDGER_DIR overrides). `reap()`
touches only recorded ids, and only those whose creating process is gone from this host.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..util import atomic_write_json, log, read_json, redact, run_cmd

LEDGER_ENV = "SWEFLOW_LEDGER_DIR"
LEDGER_SUBDIR = Path(".sweflow") / "sandboxes"
KINDS = ("sandbox", "building", "container")
_CONTAINER_ID = re.compile(r"^[0-9a-f]{12,64}\Z")


def ledger_dir(workdir: str | os.PathLike | None = None) -> Path:
    """`<workdir>/.sweflow/sandboxes`; without `workdir`: $SWEFLOW_LEDGER_DIR, else under the cwd."""
    if workdir is None and os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV]).absolute()
    return (Path(workdir) if workdir is not None else Path.cwd()).absolute() / LEDGER_SUBDIR


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (tells a reused pid apart); None if it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


# One JSON file per item under `<working dir>/.sweflow/sandboxes/` ($SWEFLOW_LEDGER_DIR overrides), written
# atomically when the item is created and removed when it is killed or cleaned up. An entry names the
# provider, the item's id and what to remove, and the creating process (pid, its start time, host).
def record(kind: str, provider: str, item_id: str, **details: Any) -> Path | None:
    """Write the ledger entry of a new item and return its path (give it to forget() once it is gone).

    A ledger that cannot be written is logged, not raised: it must never stop the work itself.
    """
    pid = os.getpid()
    entry = {
        "kind": kind,
        "provider": provider,
        "id": item_id,
        "pid": pid,
        "pid_start": _start_time(pid),
        "host": socket.gethostname(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "details": details,
    }
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", item_id)
    path = ledger_dir() / f"{provider}-{kind}-{safe}.json"
    try:
        atomic_write_json(path, entry)
    except OSError as exc:
        log.warning("sandbox ledger: cannot record %s %s: %s", provider, item_id, exc)
        return None
    return path


def forget(path: Path | None) -> None:
    """Remove a ledger entry (the item was cleaned up); missing is fine."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def owner_alive(entry: dict[str, Any]) -> bool:
    """True unless the entry's creating process is provably gone (same host, pid absent or reused)."""
    if entry.get("host") != socket.gethostname():
        return True  # cannot tell from here
    pid = entry.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    now = _start_time(pid)
    if now is None:
        return False
    return entry.get("pid_start") in (None, now)


@dataclass
class ReapReport:
    """What reap() did: one line per reaped item, per failure, and the entries left to live owners."""

    reaped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    alive: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"reaped {len(self.reaped)} leftover(s), {len(self.failed)} failed,"
            f" {len(self.alive)} left to running owners"
        )


def _label(entry: dict[str, Any]) -> str:
    return f"{entry.get('provider')} {entry.get('kind')} {entry.get('id')}"


def _pids_using(folder: str) -> list[int]:
    """Processes whose command line names `folder` (the bwrap/nsenter of a local sandbox binds it)."""
    needle = folder.rstrip("/") + "/"
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            args = p.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.decode("utf-8", "replace").startswith(needle) for a in args):
            found.append(int(p.name))
    return found


def _kill_processes(folder: str, timeout: float = 30.0) -> int:
    """SIGKILL the process groups of the processes that bind `folder` until none is left; returns how many
    there were. Each pass scans again, so a process that appeared since the last scan (one forked into a
    new session, out of the killed group) is killed too. Raises OSError if some are still running at the
    end of `timeout` (the folder is then not removed: a process still uses it)."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while pids := _pids_using(folder):
        if time.monotonic() >= deadline:
            raise OSError(
                f"{len(pids)} process(es) using {folder} still running after {timeout:.0f} s: {pids}"
            )
        seen.update(pids)
        for pid in pids:  # again each pass: a signal to a process already exiting is harmless
            with contextlib.suppress(OSError):
                pgid = os.getpgid(pid)
                # our commands are started as group leaders (start_new_session); never kill our own group
                if pgid == pid and pgid != os.getpgid(0):
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return len(seen)


def _checked_dir(path: str, parent_name: str | None = None, prefix: str | None = None) -> Path:
    """`path` if it looks like what the ledger records (never an arbitrary folder of a tampered entry)."""
    p = Path(path)
    ok = p.is_absolute() and ".." not in p.parts
    if parent_name is not None:
        ok = ok and p.parent.name == parent_name
    if prefix is not None:
        ok = ok and p.name.startswith(prefix) and p.parent == Path(tempfile.gettempdir())
    if not ok:
        raise ValueError(f"refusing to remove {path!r}: not a folder the ledger records")
    return p


def _reap_local_sandbox(entry: dict[str, Any]) -> str:
    folder = _checked_dir(entry["details"]["dir"], parent_name="_sandboxes")
    if folder.name != entry["id"]:
        raise ValueError(f"refusing to remove {folder}: it is not sandbox {entry['id']}")
    killed = _kill_processes(str(folder))
    from .limits import Limits

    # what its limits left: the scratch tmpfs mounts first (else rmtree stops at them), then its cgroups
    Limits.release(entry["id"], mounts=[folder / "tmp", folder / "home"])
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        raise OSError(f"cannot remove {folder}")
    return f"killed {killed} process(es), removed {folder}"


def _docker_rm(cid: str) -> str:
    if not _CONTAINER_ID.match(cid):
        raise ValueError(f"refusing to remove container {cid!r}: not a container id")
    if shutil.which("docker") is None:
        raise RuntimeError("the docker CLI is not installed")
    res = run_cmd(["docker", "rm", "-f", cid], timeout=120)
    if res.returncode != 0:
        if "No such container" in res.stderr:
            return "container already gone"
        raise RuntimeError(f"docker rm -f {cid[:12]} failed: {res.stderr.strip()[-300:]}")
    return f"removed container {cid[:12]}"


def _reap_docker(entry: dict[str, Any]) -> str:
    what = _docker_rm(str(entry["details"].get("container", "")))
    if entry["details"].get("folder"):
        try:  # the container is gone: a folder we may not remove is noted, not a reason to try again
            shutil.rmtree(
                _checked_dir(entry["details"]["folder"], prefix="sweflow-docker-"), ignore_errors=True
            )
        except ValueError as exc:
            what += f"; {exc}"
    return what


def _reap_e2b(entry: dict[str, Any]) -> str:
    key = os.environ.get("E2B_API_KEY", "")
    if not key:
        raise RuntimeError("E2B_API_KEY is not set; cannot kill it (it ends at its lifetime timeout)")
    from e2b import Sandbox

    opts: dict[str, Any] = {"api_key": key, "request_timeout": 30}
    if entry["details"].get("domain"):
        opts["domain"] = entry["details"]["domain"]
    try:
        found = Sandbox.kill(sandbox_id=entry["id"], **opts)
    except Exception as exc:  # noqa: BLE001 - reported per item, never fatal
        raise RuntimeError(" ".join(redact(f"{type(exc).__name__}: {exc}", [key]).split())) from None
    return "killed" if found else "already gone"


def _reap_building(entry: dict[str, Any]) -> str:
    folder = _checked_dir(entry["details"]["path"], parent_name="_building")
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        raise OSError(f"cannot remove {folder}")
    return f"removed {folder}"


def _reaper(entry: dict[str, Any]) -> Callable[[dict[str, Any]], str]:
    kind, provider = entry.get("kind"), entry.get("provider")
    if kind == "building":
        return _reap_building
    if kind == "container" or (kind == "sandbox" and provider == "docker"):
        return _reap_docker
    if kind == "sandbox" and provider == "local":
        return _reap_local_sandbox
    if kind == "sandbox" and provider == "e2b":
        return _reap_e2b
    raise ValueError(f"unknown ledger entry kind {kind!r} for provider {provider!r}")


# `reap()` acts only on entries whose creating process is gone from this host: a concurrently running pipeline
# keeps its sandboxes. Nothing is ever matched by name pattern; only recorded ids are touched.
def reap(workdir: str | os.PathLike | None = None, *, say: Callable[[str], None] | None = None) -> ReapReport:
    """Remove the recorded leftovers of dead runs (one `say` line per item, then the summary line).

    Entries whose owner still runs on this host (or on another host) are left alone; an item that cannot
    be removed keeps its entry for the next try and is reported, never raised.
    """
    say = say or (lambda line: log.info("%s", line))
    report = ReapReport()
    top = ledger_dir(workdir)
    files = sorted(top.glob("*.json")) if top.is_dir() else []
    for path in files:
        try:
            entry = read_json(path)
            if not isinstance(entry, dict) or not isinstance(entry.get("details"), dict):
                raise ValueError("not a ledger entry")
        except (OSError, ValueError) as exc:
            report.failed.append(f"{path.name}: unreadable ledger entry ({exc})")
            say(f"FAILED {report.failed[-1]}")
            continue
        label = _label(entry)
        if owner_alive(entry):
            report.alive.append(label)
            continue
        try:
            what = _reaper(entry)(entry)
        except Exception as exc:  # noqa: BLE001 - one failing item never stops the others
            report.failed.append(f"{label}: {exc}")
            say(f"FAILED {label}: {exc}")
            continue
        forget(path)
        report.reaped.append(label)
        say(f"reaped {label} (left by pid {entry.get('pid')}): {what}")
    say(report.summary())
    return report


def reap_on_start(workdir: str | os.PathLike | None = None) -> ReapReport | None:
    """The Snakefile's `onstart:` hook: reap when the ledger holds entries; silent and instant otherwise."""
    top = ledger_dir(workdir)
    try:
        if not any(top.iterdir()):
            return None
    except OSError:
        return None
    return reap(workdir, say=lambda line: print(f"sweflow reap: {line}", file=sys.stderr, flush=True))
