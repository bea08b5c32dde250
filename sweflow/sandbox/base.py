"""The sandbox provider interface shared by the local, Docker and E2B backends."""

from __future__ import annotations

import atexit
import threading
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import SandboxError
from . import ledger

OUTPUT_TAIL_CHARS = 64_000
BLACKBOX_PORT = 31000
# A command that ran out of time: coreutils `timeout`'s status, and SIGKILL's when it had to kill (-k).
TIMEOUT_EXIT = 124
KILLED_EXIT = 137
TIMEOUT_EXITS = (TIMEOUT_EXIT, KILLED_EXIT)
# run_logged keeps at most this much of an evaluation log (a log past it is cut, with a note at the end).
LOGGED_MAX_BYTES = 64 << 20


def tail(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """Keep the last `limit` characters of a command's output."""
    return text if len(text) <= limit else text[-limit:]


@dataclass
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class BackgroundCommand(Protocol):
    """A command started in the background inside a sandbox."""

    def poll(self) -> CommandResult | None:
        """None while running; the result (bounded output tails) once it has finished."""

    def kill(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """One sandbox. ``blackbox_token``: the per-sandbox secret its blackbox server demands on every endpoint
    but /health (send ``Authorization: Bearer <token>``). ``egress_url``: where the ONE host endpoint this
    sandbox may reach (the ``egress`` given to ``Provider.create``, i.e. the proxy) appears inside it, or
    None when no egress was asked for (or the provider reaches the proxy by its public URL, as E2B does).
    """

    id: str
    template: str
    blackbox_token: str
    egress_url: str | None

    def run(
        self,
        cmd: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        """Run `cmd` through bash; a non-zero exit is a result, not an exception. Provider faults raise SandboxError."""

    def start(
        self, cmd: str, *, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> BackgroundCommand: ...

    def write_file(self, path: str, data: bytes | str, *, timeout: float = 60) -> None: ...

    def read_file(self, path: str, *, timeout: float = 60) -> bytes: ...

    def run_logged(
        self,
        cmd: str,
        log_path: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_bytes: int = LOGGED_MAX_BYTES,
    ) -> CommandResult:
        """Run `cmd` (bash) with its stdout+stderr streamed to the HOST file `log_path`; the trusted channel.

        Grading depends on this: the output travels through a pipe that the provider reads, never through a
        file inside the sandbox (which the tested code could rewrite), and ``exit_code`` is the provider's
        own record of the process it started (124 with timed_out=True past `timeout`). When it returns, no
        process that `cmd` started is still alive in the sandbox (the provider killed any leftovers, so
        nothing can keep writing). Output past `max_bytes` is dropped (the file ends with a truncation note).
        The returned stdout/stderr are empty: read `log_path`. The sandbox may be unusable afterwards
        (only `kill` is guaranteed to work).
        """

    def port_url(self, port: int) -> str:
        """The base URL (scheme://host:port) at which the caller reaches `port` inside the sandbox."""

    def kill(self) -> None:
        """Stop the sandbox and free its resources; idempotent."""

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass
class TemplateRecord:
    """What a template build produced: one record per image, written by the build_template rule."""

    image: str
    provider: str
    template: str
    spec_hash: str
    build_id: str = ""
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Provider(Protocol):
    name: str

    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        egress: str | None = None,
    ) -> Sandbox:
        """Start a sandbox from a built template; `timeout` bounds the sandbox's lifetime in seconds.

        ``egress`` ("host:port" on the caller's machine, normally the token-recording proxy) is the only
        endpoint outside the sandbox that its processes may reach; ``sandbox.egress_url`` says where it
        appears inside. Without it the sandbox reaches nothing outside itself. Providers also take
        ``network`` ("none", the default, or "internet"): the fresh evaluation's outbound network
        (``sandbox.network``), refused for sandboxes that run a server or have an egress (the agent's).
        """


class SandboxBase:
    """Shared lifetime handling: context manager, idempotent kill, kill on interpreter exit, and the
    sandbox's ledger entry (sweflow.sandbox.ledger): `_record()` at create, removed once kill succeeded
    (a subclass whose kill failed quietly sets `_ledger_keep` so the next run reaps it)."""

    _live: weakref.WeakSet = weakref.WeakSet()
    _lock = threading.Lock()

    def __init__(self, sid: str, template: str) -> None:
        self.id = sid
        self.template = template
        self._killed = False
        self._ledger_file: Path | None = None
        self._ledger_keep = False
        with SandboxBase._lock:
            SandboxBase._live.add(self)

    def _record(self, provider: str, **details: Any) -> None:
        """Write this sandbox's ledger entry: what the reaper needs to remove it if this process dies."""
        self._ledger_file = ledger.record("sandbox", provider, self.id, **details)

    def _kill(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def kill(self) -> None:
        with SandboxBase._lock:
            if self._killed:
                return
            self._killed = True
            SandboxBase._live.discard(self)
        self._kill()
        if not self._ledger_keep:
            ledger.forget(self._ledger_file)

    @property
    def killed(self) -> bool:
        return self._killed

    def _check_alive(self) -> None:
        if self._killed:
            raise SandboxError("sandbox was already killed", file=self.template, row=self.id)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@atexit.register
def _kill_all_live_sandboxes() -> None:
    for sb in list(SandboxBase._live):
        try:
            sb.kill()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
