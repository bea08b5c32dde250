"""A running Docker sandbox: commands through the exec API, files through the archive API.

Exit code 124 means timed out; exit codes always come from exec_inspect, never from a file the sandbox
could write. Sandboxes come from `DockerProvider.create` (`sweflow.sandbox.docker`).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math
import secrets
import shlex
import shutil
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from .base import (
    BLACKBOX_PORT,
    LOGGED_MAX_BYTES,
    TIMEOUT_EXIT,
    CommandResult,
    SandboxBase,
    tail,
)
from .docker_api import _call
from .egress import Routes
from .logged import LogSink

log = logging.getLogger("sweflow.sandbox.docker")

GRACE = 15.0
BG_DIR = "/tmp/.sweflow-bg"
DISK_POLL_S = 5.0  # how often a sandbox's writable layer is measured where the driver cannot cap it
KILLED_EXIT = 137
# After run_logged's command ended: kill every process but PID 1 (the init) and the ones the sandbox was
# created with (keep-alive, forwarders; their pids recorded at start), so nothing it left keeps writing.
_KILL_REST = (
    'for p in /proc/[0-9]*; do p=${p#/proc/}; case " 1 $$ $1 " in *" $p "*) ;; *) kill -9 $p 2>/dev/null;;'
    " esac; done; true"
)


# Background commands run detached under `setsid -w` with their output in /tmp/.sweflow-bg (informational
# tails).
class _DockerBackground:
    """A detached exec; its exit code is exec_inspect's, its output tails come from files (informational)."""

    def __init__(self, sb: DockerSandbox, n: int, exec_id: str, started: float) -> None:
        self.sb, self.n, self.exec_id, self.started = sb, n, exec_id, started
        self._result: CommandResult | None = None
        self._killed = False

    def poll(self) -> CommandResult | None:
        if self._result is not None:
            return self._result
        info = self.sb._inspect(self.exec_id)
        if info.get("Running") or info.get("ExitCode") is None:
            return None
        rc = KILLED_EXIT if self._killed else int(info["ExitCode"])
        d = f"{BG_DIR}/{self.n}"
        out = self.sb.run(f"tail -c 64000 {d}.out", timeout=30).stdout
        err = self.sb.run(f"tail -c 64000 {d}.err", timeout=30).stdout
        self._result = CommandResult(rc, out, err, False, time.monotonic() - self.started)
        return self._result

    def kill(self) -> None:
        """Kill the command's process group (the session `setsid` made); poll() then reports 137."""
        if not self.sb.killed and self._result is None:
            self._killed = True
            d = f"{BG_DIR}/{self.n}"
            self.sb.run(f"kill -KILL -- -$(cat {d}.pid) 2>/dev/null; true", timeout=30)


class DockerSandbox(SandboxBase):
    def __init__(
        self,
        provider: Any,  # the DockerProvider (sweflow.sandbox.docker imports this module, not back)
        container: Any,
        template: str,
        *,
        timeout: float,
        routes: Routes | None = None,
        folder: Path | None = None,
    ) -> None:
        super().__init__(container.id[:12], template)
        self._record(provider.name, container=container.id, folder=str(folder) if folder else "")
        self.provider, self.container = provider, container
        self.routes, self.folder = routes, folder
        self.blackbox_token = secrets.token_urlsafe(32)
        self.egress_url: str | None = None
        self.server: _DockerBackground | None = None
        self.base_pids = ""
        self._bg = itertools.count()
        self._timer = threading.Timer(timeout, self.kill)
        self._timer.daemon = True
        self._timer.start()
        self.disk_exceeded = False
        self._watch_stop = threading.Event()
        if provider.disk_mb and provider._disk_opt_ok is False:
            # the storage driver cannot cap the writable layer: measure it and kill the sandbox past the cap
            threading.Thread(target=self._watch_disk, name=f"disk-{self.id}", daemon=True).start()

    # Where the storage driver cannot cap the writable layer, a watchdog thread measures it and kills the
    # sandbox past `disk_mb`.
    def _watch_disk(self) -> None:
        cap = int(self.provider.disk_mb) * 1024 * 1024
        while not self._watch_stop.wait(DISK_POLL_S):
            try:
                [info] = self.provider.client.api.containers(
                    all=True, size=True, filters={"id": self.container.id}
                )
                used = int(info.get("SizeRw") or 0)
            except Exception:  # noqa: BLE001 - a container we cannot inspect is gone or going
                return
            if used > cap:
                self.disk_exceeded = True
                log.warning(
                    "sandbox %s wrote %d MB, over its disk cap of %s MB: killed",
                    self.id,
                    used // 2**20,
                    self.provider.disk_mb,
                )
                with contextlib.suppress(Exception):
                    self.kill()
                return

    @property
    def blackbox_port(self) -> int | None:
        return self.routes.blackbox_port if self.routes else None

    def _running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:  # noqa: BLE001 - a container we cannot inspect is not one to wait for
            return False

    def _record_base_pids(self) -> None:
        """Remember the keep-alive (PID 1's child) and its children (the forwarders), before any command."""
        script = (
            # the children file ends in a space: the first word is the pid
            "set -- $(cat /proc/1/task/*/children); k=$1; for _ in $(seq 50); do"
            ' [ "$(cat /proc/$k/comm 2>/dev/null)" = sleep ] && break; sleep 0.1; done;'
            " echo $k $(cat /proc/$k/task/*/children 2>/dev/null)"
        )
        r = self.run(script, timeout=30)
        self.base_pids = " ".join(p for p in r.stdout.split() if p.isdigit())

    def _kill_leftovers(self) -> None:
        with contextlib.suppress(SandboxError):
            self._exec(["/bin/sh", "-c", _KILL_REST, "kill", self.base_pids], timeout=30)

    def _create_exec(self, argv: list[str], env=None, cwd=None) -> str:
        self._check_alive()
        api = self.provider.api_long
        ex = _call(
            lambda: api.exec_create(self.container.id, argv, environment=env, workdir=cwd),
            60, "exec create", self.template, self.id,
        )  # fmt: skip
        return ex["Id"]

    def _inspect(self, exec_id: str) -> dict[str, Any]:
        return _call(
            lambda: self.provider.api_long.exec_inspect(exec_id), 60, "exec inspect", self.template, self.id
        )

    def _exec(
        self, argv: list[str], *, timeout: float, env=None, cwd=None
    ) -> tuple[int, bytes, bytes, float]:
        api = self.provider.api_long
        t0 = time.monotonic()
        exec_id = self._create_exec(argv, env, cwd)

        def go() -> tuple[bytes | None, bytes | None]:
            return api.exec_start(exec_id, demux=True)

        try:
            out, err = _call(go, timeout + GRACE, "exec", self.template, self.id)
        except SandboxError as exc:
            if "timed out" not in str(exc):
                raise
            return TIMEOUT_EXIT, b"", b"client-side timeout", time.monotonic() - t0
        rc = self._inspect(exec_id)["ExitCode"]
        return (rc if rc is not None else -1), out or b"", err or b"", time.monotonic() - t0

    # Commands run as `timeout -k 5 <t> bash -c CMD` through the exec API, and the client also gives up after
    # the timeout plus a grace period, so a hung daemon call cannot block a caller. Exit code 124 means timed
    # out; exit codes always come from exec_inspect, never from a file the sandbox could write.
    def run(self, cmd: str, *, timeout: float, env=None, cwd=None) -> CommandResult:
        """Run through bash under `timeout`; exit_code 124 with timed_out=True when it ran out of time."""
        t = max(1, math.ceil(timeout))
        rc, out, err, dur = self._exec(
            ["timeout", "-k", "5", str(t), "/bin/bash", "-c", cmd], timeout=timeout, env=env, cwd=cwd
        )
        timed_out = rc == TIMEOUT_EXIT and dur >= timeout * 0.98
        return CommandResult(
            rc, tail(out.decode("utf-8", "replace")), tail(err.decode("utf-8", "replace")), timed_out, dur
        )

    def run_logged(
        self,
        cmd: str,
        log_path: str,
        *,
        timeout: float,
        env=None,
        cwd=None,
        max_bytes: int = LOGGED_MAX_BYTES,
    ) -> CommandResult:
        """Run `cmd` with its output streamed to the host file `log_path`; exit code from exec_inspect.

        The exec's end is watched with exec_inspect (the stream stays open while any daemon holds the
        pipe); then every process but the init, the keep-alive and the forwarders is killed (the server
        too), so the stream ends and nothing writes later.
        """
        api = self.provider.api_long
        t0 = time.monotonic()
        deadline = t0 + timeout
        exec_id = self._create_exec(["/bin/bash", "-c", cmd], env, cwd)
        sink = LogSink(log_path, max_bytes)

        def stream() -> None:
            try:
                for out, err in api.exec_start(exec_id, stream=True, demux=True):
                    for chunk in (out, err):
                        if chunk:
                            sink.write(chunk)
            except Exception as exc:  # noqa: BLE001 - the stream ends when the container's processes die
                log.debug("run_logged stream of %s: %s", self.id, exc)

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        timed_out = False
        rc: int | None = None
        try:
            while True:
                info = self._inspect(exec_id)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    rc = int(info["ExitCode"])
                    break
                if time.monotonic() > deadline:
                    timed_out, rc = True, TIMEOUT_EXIT
                    break
                time.sleep(0.05)
        finally:
            self._kill_leftovers()
            reader.join(30)
            sink.close()
        return CommandResult(rc if rc is not None else -1, "", "", timed_out, time.monotonic() - t0)

    def start(self, cmd: str, *, env=None, cwd=None) -> _DockerBackground:
        n = next(self._bg)
        d = f"{BG_DIR}/{n}"
        # setsid -w: the command leads its own session (one group to kill), and the exec's exit is its exit
        wrapper = f'echo $$ > {d}.pid; exec /bin/bash -c "$1" > {d}.out 2> {d}.err'
        self._check_alive()
        r = self.run(f"mkdir -p {BG_DIR}", timeout=30)
        if not r.ok:
            raise SandboxError(f"start: mkdir failed: {r.stderr.strip()}", file=self.template, row=self.id)
        exec_id = self._create_exec(["setsid", "-w", "/bin/bash", "-c", wrapper, "bg", cmd], env, cwd)
        api = self.provider.api_long
        _call(lambda: api.exec_start(exec_id, detach=True), 60, "exec start", self.template, self.id)
        return _DockerBackground(self, n, exec_id, time.monotonic())

    def write_file(self, path: str, data: bytes | str, *, timeout: float = 60) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        parent, name = path.rsplit("/", 1) if "/" in path else (".", path)
        parent = parent or "/"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(payload))

        def put() -> bool:
            return _call(
                lambda: self.container.put_archive(parent, buf.getvalue()),
                timeout,
                "write_file",
                path,
                self.id,
            )

        try:
            ok = put()
        except SandboxError as exc:
            # the engine answers 404 for a missing folder: make it, then write (an exec more only then)
            if getattr(exc.__cause__, "status_code", None) != 404:
                raise
            r = self.run(f"mkdir -p {shlex.quote(parent)}", timeout=timeout)
            if not r.ok:
                raise SandboxError(
                    f"write_file: mkdir failed: {r.stderr.strip()}", file=path, row=self.id
                ) from None
            ok = put()
        if not ok:
            raise SandboxError("write_file: put_archive refused", file=path, row=self.id)

    def read_file(self, path: str, *, timeout: float = 60) -> bytes:
        def go() -> bytes:
            stream, _ = self.container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                f = tar.extractfile(member) if member else None
                if f is None:
                    raise SandboxError("read_file: not a regular file", file=path, row=self.id)
                return f.read()

        return _call(go, timeout, "read_file", path, self.id)

    def port_url(self, port: int) -> str:
        """The host URL of the blackbox server (the only port reachable from the host)."""
        if port != BLACKBOX_PORT or self.blackbox_port is None:
            raise SandboxError(
                f"port {port} of a docker sandbox is not reachable from the host",
                file=self.template,
                row=self.id,
                hint=f"only the blackbox server (:{BLACKBOX_PORT}, start_server=True) is forwarded",
            )
        return f"http://127.0.0.1:{self.blackbox_port}"

    def _kill(self) -> None:
        self._timer.cancel()
        self._watch_stop.set()
        try:
            _call(lambda: self.container.remove(force=True), 60, "container remove", self.template, self.id)
        except SandboxError as exc:
            if "No such container" not in str(exc) and "is already in progress" not in str(exc):
                raise
        finally:
            if self.routes is not None:
                self.routes.close()
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
