"""Child processes in their own process group: bounded output tails, timeout, abort, group kill.

Standard library only (runs inside sandboxes from an isolated runtime).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

TAIL_CHARS = 64_000
KILL_GRACE_S = 1.5
READER_JOIN_S = 2.0
SCAN_INTERVAL_S = 0.5


def _read_stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], starttime [19])."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _read_stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every live descendant of `root` as {pid: start time}; empty where /proc is unavailable."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    children: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        if not name.isdigit():
            continue
        fields = _read_stat(name)
        if fields and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append((int(name), fields[19]))
    found: dict[int, str] = {}
    stack = [root]
    while stack:
        for pid, start in children.get(stack.pop(), []):
            if pid not in found:
                found[pid] = start
                stack.append(pid)
    return found


class TailBuffer:
    """Keeps the last `limit` characters written to it (thread-safe)."""

    def __init__(self, limit: int = TAIL_CHARS) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._size = 0
        self.total = 0
        self._lock = threading.Lock()

    def write(self, chunk: str) -> None:
        with self._lock:
            self._parts.append(chunk)
            self._size += len(chunk)
            self.total += len(chunk)
            if self._size > 2 * self.limit:
                joined = "".join(self._parts)[-self.limit :]
                self._parts, self._size = [joined], len(joined)

    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)[-self.limit :]


@dataclass
class ProcessOutcome:
    """How a child ended: `reason` is exited, timeout or aborted; returncode is None if it could not be reaped."""

    reason: str
    returncode: int | None
    duration: float


def _pump(stream, on_line: Callable[[str], None]) -> None:
    # Line-wise so stream-json events are handled as soon as the agent prints them.
    try:
        for raw in iter(stream.readline, b""):
            on_line(raw.decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


class GroupProcess:
    """A child started in a new session (its own process group) whose stdout/stderr are pumped by threads."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        on_stdout: Callable[[str], None],
        on_stderr: Callable[[str], None],
        stdin_data: bytes | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._readers = [
            threading.Thread(target=_pump, args=(self.proc.stdout, on_stdout), daemon=True),
            threading.Thread(target=_pump, args=(self.proc.stderr, on_stderr), daemon=True),
        ]
        for t in self._readers:
            t.start()
        if stdin_data is not None:
            threading.Thread(target=self._feed, args=(stdin_data,), daemon=True).start()
        self._killed = threading.Event()
        self._tracked: dict[int, str] = {}

    def _feed(self, data: bytes) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass  # the child exited before reading its input; its exit status tells the story

    @property
    def pid(self) -> int:
        return self.proc.pid

    def track(self) -> None:
        """Remember the current descendants (with start times, so a recycled pid is never hit)."""
        self._tracked.update(descendants(self.proc.pid))

    def _signal_all(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid, start in list(self._tracked.items()):
            if _start_time(pid) == start:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def kill_group(self) -> None:
        """SIGTERM the group and every tracked descendant, SIGKILL them after a short grace; idempotent.

        Descendants matter because Claude Code runs its Bash tool in a new session (its own process
        group): a group kill alone would miss it once the CLI is SIGKILLed.
        """
        if self._killed.is_set():
            return
        self._killed.set()
        self.track()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline and (self.proc.poll() is None or self._alive_tracked()):
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)

    def _alive_tracked(self) -> bool:
        return any(_start_time(pid) == start for pid, start in self._tracked.items())

    def wait(
        self, timeout: float | None, cancel: threading.Event, *, reap_group: bool = True
    ) -> ProcessOutcome:
        """Wait for exit, the timeout, or `cancel`; kills everything on timeout/cancel and joins the readers.

        With `reap_group`, processes left in the group after a normal exit are killed too (so nothing the
        agent started outlives its turn); without it, background children keep running.
        """
        deadline = None if timeout is None else self.started + timeout
        reason = "exited"
        next_scan = 0.0
        while self.proc.poll() is None:
            if cancel.is_set():
                reason = "aborted"
                break
            if deadline is not None and time.monotonic() >= deadline:
                reason = "timeout"
                break
            if time.monotonic() >= next_scan:
                self.track()  # processes reparented to init after their parent dies are no longer findable
                next_scan = time.monotonic() + SCAN_INTERVAL_S
            cancel.wait(0.05)
        if reason != "exited":
            self.kill_group()
        elif reap_group:
            # Grandchildren may still hold the pipes; the group goes with its leader.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            returncode: int | None = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            returncode = None
        join_until = time.monotonic() + READER_JOIN_S
        for t in self._readers:
            t.join(max(0.0, join_until - time.monotonic()))
        return ProcessOutcome(reason, returncode, time.monotonic() - self.started)


@dataclass
class CommandOutput:
    """Result of `run_command`; returncode is 124 when the command timed out (like coreutils `timeout`)."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    aborted: bool
    duration: float

    def to_dict(self) -> dict[str, object]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "aborted": self.aborted,
            "duration": round(self.duration, 3),
        }


def run_command(
    cmd: str,
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    cancel: threading.Event,
    tail_chars: int = TAIL_CHARS,
    on_start: Callable[[GroupProcess], None] | None = None,
) -> CommandOutput:
    """Run `bash -lc cmd` in its own process group, keeping only the output tails."""
    out, err = TailBuffer(tail_chars), TailBuffer(tail_chars)
    proc = GroupProcess(["bash", "-lc", cmd], cwd=cwd, env=env, on_stdout=out.write, on_stderr=err.write)
    if on_start is not None:
        on_start(proc)
    outcome = proc.wait(timeout, cancel, reap_group=False)
    timed_out = outcome.reason == "timeout"
    if timed_out:
        code = 124
    elif outcome.returncode is None:
        code = -1
    else:
        code = outcome.returncode
    return CommandOutput(
        out.text(), err.text(), code, timed_out, outcome.reason == "aborted", outcome.duration
    )
