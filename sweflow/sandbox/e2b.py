"""E2B backend: sandboxes from built E2B templates, through the e2b SDK (2.6x).

`E2BProvider().create(template, timeout=...)` starts a cloud sandbox; `build_template(...)` builds a
template with the SDK's v2 builder (see `sweflow.sandbox.e2b_template`). The API key comes from
the argument or E2B_API_KEY and never appears in a message or log line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import httpx
from e2b import (
    CommandExitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    TimeoutException,
)
from e2b import Sandbox as SdkSandbox

from ..errors import SandboxError
from .base import (
    LOGGED_MAX_BYTES,
    OUTPUT_TAIL_CHARS,
    TIMEOUT_EXIT,
    CommandResult,
    SandboxBase,
    TemplateRecord,
    tail,
)
from .e2b_api import E2BApi, status_of
from .e2b_template import build_e2b_template
from .logged import LogSink

log = logging.getLogger("sweflow.sandbox.e2b")

KILLED_EXIT_CODE = 137  # 128 + SIGKILL: a background command stopped by kill()
CONTROL_TIMEOUT = 60.0  # seconds for the short helper commands of background jobs
TOKEN_FILE = "/run/sweflow/blackbox.token"  # where the server looks (its start command never sees our envs)
RUN_MARK = "SWEFLOW_LOGGED_RUN"  # marks run_logged's processes so leftovers can be found and killed


class _TailBuffer:
    """Keeps only the last `limit` characters of a stream of chunks."""

    def __init__(self, limit: int = OUTPUT_TAIL_CHARS) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0

    def add(self, chunk: str) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.size > 2 * self.limit:
            text = "".join(self.parts)[-self.limit :]
            self.parts, self.size = [text], len(text)

    def text(self) -> str:
        return tail("".join(self.parts), self.limit)


# E2B_API_URL / E2B_SANDBOX_URL / E2B_DOMAIN / E2B_DEBUG are honoured by the SDK (tests point them at local
# fakes).
class E2BProvider(E2BApi):
    """Creates E2B sandboxes and builds E2B templates (the settings and retry policy are `E2BApi`'s)."""

    name = "e2b"

    def __repr__(self) -> str:  # never show the key
        return f"E2BProvider(domain={self.domain!r}, api_url={self.api_url!r}, attempts={self.attempts})"

    def _port_scheme(self) -> str:
        debug = self.debug if self.debug is not None else os.environ.get("E2B_DEBUG", "").lower() == "true"
        if debug:
            return "http"
        sandbox_url = self.sandbox_url or os.environ.get("E2B_SANDBOX_URL")
        if sandbox_url:
            return urlparse(sandbox_url).scheme or "https"
        return "https"

    # -- sandboxes -------------------------------------------------------------------------------
    # Retries: the SDK's own response retries are switched off (retries=0) so that `sweflow.sandbox.e2b_api`
    # owns the policy in one place: `attempts` tries with backoff on 5xx, 429 and timeouts; a 4xx (unknown
    # template, bad key) fails at once. Sandbox creation reuses one idempotency key across its tries, so a
    # create whose answer was lost to a timeout does not leave a second sandbox behind.
    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        egress: str | None = None,
        network: str | None = None,
    ) -> E2BSandbox:
        """Start a sandbox from `template`; `timeout` (s) is its lifetime. `env` reaches every command.
        `network` (fresh evaluations): "none" - allow_internet_access=False, "internet" - True; None - the
        SDK's default (agent sandboxes, which reach the proxy by its public URL).

        `egress` is ignored: an E2B sandbox reaches the proxy by its public URL (egress_url is None). The
        blackbox token is written to /run/sweflow/blackbox.token right after the start."""
        key = uuid.uuid4().hex  # one key for all tries: a lost answer does not leave a twin sandbox
        lifetime = max(1, int(timeout + 0.999))
        if network not in (None, "none", "internet"):
            raise SandboxError(f"unknown network {network!r}", file=template, field="network")
        net = {} if network is None else {"allow_internet_access": network == "internet"}

        def create_once() -> SdkSandbox:
            return SdkSandbox.create(
                template=template,
                timeout=lifetime,
                envs=dict(env or {}),
                metadata=dict(metadata or {}),
                idempotency_key=key,
                **net,
                **self.api_params(),
            )

        try:
            sdk = self.call(
                create_once, what=f"creating an E2B sandbox from template {template!r}", file=template
            )
        except SandboxError as exc:
            cause = exc.__cause__
            if cause is not None and status_of(cause) == 404:
                raise SandboxError(
                    f"E2B template {template!r} not found",
                    file=template,
                    hint="build it first (build_template rule) or check the template name",
                ) from cause
            raise
        log.info("e2b sandbox %s started from template %s", sdk.sandbox_id, template)
        sb = E2BSandbox(sdk, template, self)
        try:
            sb.write_file(TOKEN_FILE, sb.blackbox_token)
        except BaseException:
            sb.kill()
            raise
        return sb

    # -- templates -------------------------------------------------------------------------------
    def build_template(
        self,
        spec: Any = None,
        name: str | None = None,
        *,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        build_timeout: float = 3600.0,
        poll_interval: float = 2.0,
        on_log: Callable[[str], None] | None = None,
        **fields: Any,
    ) -> TemplateRecord:
        """Build the E2B template `name` for a template spec (or its fields as keywords).

        See `sweflow.sandbox.e2b_template.build_e2b_template` for what is built and how."""
        return build_e2b_template(
            self,
            spec,
            name,
            cpu_count=cpu_count,
            memory_mb=memory_mb,
            build_timeout=build_timeout,
            poll_interval=poll_interval,
            on_log=on_log,
            **fields,
        )


class E2BBackground:
    """A background command in an E2B sandbox, run detached and tracked through files.

    Why not the SDK's CommandHandle: its event stream lives on one HTTP connection; evaluations
    run for 20 minutes and a dropped connection would lose the exit code and the output made
    meanwhile. Here the command is detached (setsid + nohup) and writes its output, its process
    group id and finally its exit code to a private folder; `poll()` reads them with short
    commands, so any number of connection faults cost nothing.
    """

    def __init__(self, sandbox: E2BSandbox, cmd: str, env: dict[str, str] | None, cwd: str | None) -> None:
        self.sandbox = sandbox
        self.cmd = cmd
        self.folder = f'"${{TMPDIR:-/tmp}}/sweflow-bg-{uuid.uuid4().hex[:16]}"'
        self._result: CommandResult | None = None
        self._t0 = time.monotonic()
        inner = (
            'echo $$ > "$1/pgid.tmp" && mv "$1/pgid.tmp" "$1/pgid"; '
            'bash -c "$2" > "$1/out" 2> "$1/err" < /dev/null; '
            'echo $? > "$1/rc.tmp"; mv "$1/rc.tmp" "$1/rc"'
        )
        launcher = (
            f'd={self.folder}; mkdir -p "$d" || exit 1; '
            f'nohup setsid bash -c {shlex.quote(inner)} sweflow-bg "$d" {shlex.quote(cmd)} > /dev/null 2>&1 & '
            'for _ in $(seq 100); do [ -s "$d/pgid" ] && break; sleep 0.05; done; cat "$d/pgid"'
        )
        res = sandbox.run(launcher, timeout=CONTROL_TIMEOUT, env=env, cwd=cwd)
        if not res.ok or not res.stdout.strip().isdigit():
            raise SandboxError(
                f"could not start background command: exit {res.exit_code}: {tail(res.stderr.strip(), 300)}",
                file=sandbox.template,
                row=sandbox.id,
            )
        self.pgid = int(res.stdout.strip())

    def poll(self) -> CommandResult | None:
        """None while running; then the exit code and the output tails (cached)."""
        if self._result is not None:
            return self._result
        probe = self.sandbox.run(
            f'd={self.folder}; if [ -f "$d/rc" ]; then cat "$d/rc"; else echo running; fi',
            timeout=CONTROL_TIMEOUT,
        )
        state = probe.stdout.strip()
        if not probe.ok or state == "running":
            return None
        out = self.sandbox.run(f"tail -c {OUTPUT_TAIL_CHARS} {self.folder}/out", timeout=CONTROL_TIMEOUT)
        err = self.sandbox.run(f"tail -c {OUTPUT_TAIL_CHARS} {self.folder}/err", timeout=CONTROL_TIMEOUT)
        self._result = CommandResult(
            exit_code=int(state) if state.lstrip("-").isdigit() else -1,
            stdout=out.stdout,
            stderr=err.stdout,
            duration=time.monotonic() - self._t0,
        )
        return self._result

    def kill(self) -> None:
        """Stop the whole process group; poll() then reports exit code 137 unless it had finished."""
        if self.sandbox.killed or self._result is not None:
            return
        self.sandbox.run(
            f"d={self.folder}; kill -KILL -- -{self.pgid} 2>/dev/null; "
            f'[ -f "$d/rc" ] || echo {KILLED_EXIT_CODE} > "$d/rc"',
            timeout=CONTROL_TIMEOUT,
        )


class E2BSandbox(SandboxBase):
    """One running E2B sandbox (the `Sandbox` protocol); `sdk` is the e2b SDK object."""

    def __init__(self, sdk: SdkSandbox, template: str, provider: E2BProvider) -> None:
        super().__init__(sdk.sandbox_id, template)
        self._record(provider.name, domain=provider.domain or "")
        self.sdk = sdk
        self.provider = provider
        self.blackbox_token = secrets.token_urlsafe(32)
        self.egress_url: str | None = None

    def _error(self, what: str, exc: BaseException) -> SandboxError:
        return SandboxError(f"{what} failed: {self.provider.clean(exc)}", file=self.template, row=self.id)

    def run(
        self,
        cmd: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        """Run `cmd` with bash; exit codes are results, a deadline gives timed_out=True (exit 124)."""
        self._check_alive()
        if timeout <= 0:
            raise SandboxError(
                "command timeout must be positive", file=self.template, row=self.id, field="timeout"
            )
        out, err = _TailBuffer(), _TailBuffer()
        t0 = time.monotonic()
        handle = None
        try:
            # background=True only to hold the handle (and its pid) so a timed-out command can be
            # killed; wait() then consumes the same stream a foreground run would.
            handle = self.sdk.commands.run(
                cmd, background=True, envs=env, cwd=cwd, timeout=timeout, retain_output=False
            )
            result = handle.wait(on_stdout=out.add, on_stderr=err.add)
            code = result.exit_code
        except CommandExitException as exc:
            code = exc.exit_code
        except (SandboxNotRunningException, SandboxUnreachableException) as exc:
            raise self._error("command", exc) from exc
        except TimeoutException:
            if handle is not None:
                try:
                    handle.kill()
                except Exception as exc:  # noqa: BLE001 - the deadline already killed it in envd
                    log.debug("kill after timeout in %s: %s", self.id, self.provider.clean(exc))
            return CommandResult(
                TIMEOUT_EXIT, out.text(), err.text(), timed_out=True, duration=time.monotonic() - t0
            )
        except (SandboxException, httpx.HTTPError, OSError) as exc:
            raise self._error("command", exc) from exc
        return CommandResult(code, out.text(), err.text(), duration=time.monotonic() - t0)

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
        """Run `cmd` with its output streamed (envd's event stream) to the host file `log_path`; the exit
        code is the one envd reports. envd ends the stream only when every holder of the output pipe is
        gone, so once the command itself has exited, processes carrying this run's mark are killed."""
        self._check_alive()
        mark = uuid.uuid4().hex
        sink = LogSink(log_path, max_bytes)
        t0 = time.monotonic()
        box: dict[str, Any] = {}
        try:
            handle = self.sdk.commands.run(
                cmd, background=True, envs={**(env or {}), RUN_MARK: mark}, cwd=cwd, timeout=timeout,
                retain_output=False,
            )  # fmt: skip
        except (SandboxException, httpx.HTTPError, OSError) as exc:
            sink.close()
            raise self._error("command", exc) from exc

        def wait() -> None:
            try:
                box["code"] = handle.wait(
                    on_stdout=lambda t: sink.write(t.encode()), on_stderr=lambda t: sink.write(t.encode())
                ).exit_code
            except CommandExitException as exc:
                box["code"] = exc.exit_code
            except TimeoutException:
                box["timed_out"] = True
            except Exception as exc:  # noqa: BLE001 - re-raised below as a SandboxError
                box["error"] = exc

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        next_probe = time.monotonic() + 1.0
        while waiter.is_alive() and time.monotonic() < t0 + timeout + CONTROL_TIMEOUT:
            waiter.join(0.2)
            if waiter.is_alive() and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + 1.0
                gone = self.run(
                    f"kill -0 {int(handle.pid)} 2>/dev/null || echo gone", timeout=CONTROL_TIMEOUT
                )
                if gone.stdout.strip() == "gone":
                    self._kill_marked(mark)  # the command ended; leftovers hold the pipe
        self._kill_marked(mark)
        waiter.join(CONTROL_TIMEOUT)
        sink.close()
        if waiter.is_alive() or box.get("timed_out"):
            with contextlib.suppress(Exception):
                handle.kill()
            return CommandResult(TIMEOUT_EXIT, "", "", timed_out=True, duration=time.monotonic() - t0)
        if "error" in box:
            raise self._error("command", box["error"]) from box["error"]
        return CommandResult(int(box["code"]), "", "", duration=time.monotonic() - t0)

    def _kill_marked(self, mark: str) -> None:
        """Kill every process whose environment holds this run's mark (best effort)."""
        script = (
            "for d in /proc/[0-9]*; do tr '\\0' '\\n' < $d/environ 2>/dev/null"
            f" | grep -qx '{RUN_MARK}={mark}' && kill -9 ${{d#/proc/}} 2>/dev/null; done; true"
        )
        with contextlib.suppress(SandboxError):
            self.run(script, timeout=CONTROL_TIMEOUT)

    def start(self, cmd: str, *, env: dict[str, str] | None = None, cwd: str | None = None) -> E2BBackground:
        """Start `cmd` detached; poll the returned handle (see E2BBackground for why not a stream)."""
        self._check_alive()
        return E2BBackground(self, cmd, env, cwd)

    def write_file(self, path: str, data: bytes | str, *, timeout: float = 60) -> None:
        """Write (create or replace) a file, making its parent folders."""
        self._check_alive()
        try:
            self.sdk.files.write(path, data, request_timeout=timeout)
        except (SandboxException, httpx.HTTPError, OSError) as exc:
            raise SandboxError(
                f"writing {path} failed: {self.provider.clean(exc)}", file=self.template, row=self.id
            ) from exc

    def read_file(self, path: str, *, timeout: float = 60) -> bytes:
        self._check_alive()
        try:
            return bytes(self.sdk.files.read(path, format="bytes", request_timeout=timeout))
        except (SandboxException, httpx.HTTPError, OSError) as exc:
            raise SandboxError(
                f"reading {path} failed: {self.provider.clean(exc)}", file=self.template, row=self.id
            ) from exc

    def port_url(self, port: int) -> str:
        """`scheme://host` of `port`; E2B puts the port in the host name (`<port>-<id>.<domain>`)."""
        return f"{self.provider._port_scheme()}://{self.sdk.get_host(port)}"

    def _kill(self) -> None:
        try:
            self.provider.call(
                lambda: self.sdk.kill(**self.provider.api_params()),
                what=f"killing E2B sandbox {self.id}",
                file=self.template,
                row=self.id,
            )
            log.info("e2b sandbox %s killed", self.id)
        except SandboxError as exc:
            # it still dies at its lifetime timeout; do not mask the caller's own error
            log.warning("%s", exc)
            self._ledger_keep = True  # the next run's reaper tries again
