"""Local sandboxes without a container engine: a prepared workspace per template, bubblewrap per command.

Layout under `templates_root`: see `sweflow.sandbox.local_template`, which builds the templates. The agent
is hostile: every command runs as an unprivileged uid in its own bwrap namespaces, sees little of the host
and has no network but loopback (see above `LocalSandbox._argv` and `LocalSandbox._start_holder`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..util import read_json, run_cmd
from .base import (
    BLACKBOX_PORT,
    LOGGED_MAX_BYTES,
    TIMEOUT_EXIT,
    CommandResult,
    SandboxBase,
    tail,
)
from .egress import SOCKET_DIR, Routes, inside_egress_port, inside_forwarders
from .limits import Limits, LimitSpec
from .local_bwrap import UMASK, _bwrap, _chown_tree, _mkdir, _searchable
from .local_template import LocalTemplates, default_root
from .logged import LogSink
from .spec import CLAUDE_PATH, RUNTIME_DIR

SANDBOX_UID = 65534
_PATH = "/opt/miniconda3/envs/testbed/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOKEN_ENV = "SWEFLOW_BLACKBOX_TOKEN"


class LocalProvider(LocalTemplates):
    """Provider over prepared workspaces; options: templates_root, start_server, testbed_requirements,
    sandbox_uid (the unprivileged uid and gid every sandbox runs as), limits (``LimitSpec``: processes,
    memory, file size and scratch disk of each sandbox, see ``sweflow.sandbox.limits``)."""

    name = "local"

    def __init__(
        self,
        templates_root: str | os.PathLike | None = None,
        *,
        start_server: bool = True,
        testbed_requirements: tuple[str, ...] = ("pytest",),
        sandbox_uid: int = SANDBOX_UID,
        limits: LimitSpec | None = None,
    ) -> None:
        # absolute: bwrap gets bind sources from here, and every folder above must be searchable
        self.root = (Path(templates_root) if templates_root else default_root()).absolute()
        self.start_server = start_server
        self.testbed_requirements = tuple(testbed_requirements)
        if int(sandbox_uid) == 0:
            raise SandboxError("sandbox_uid must not be 0", field="sandbox_uid", hint="e.g. 65534")
        self.uid = int(sandbox_uid)
        self.limits = limits or LimitSpec()

    # ---- sandboxes -------------------------------------------------------------------------------
    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        egress: str | None = None,
        network: str | None = None,
    ) -> LocalSandbox:
        """Copy the template's workspace into a fresh sandbox and (by default) start its server.

        ``network`` "internet" shares the host's network namespace (fresh evaluations only: refused with a
        server or an egress); None or "none": loopback only."""
        tdir = self.template_dir(template)
        if not (tdir / "template.json").exists():
            raise SandboxError(
                "local template not built", file=str(tdir), row=template, hint="run build_template"
            )
        self._prepare_root()
        meta = read_json(tdir / "template.json")
        server = meta.get("start_cmd", "") if self.start_server else ""
        if network not in (None, "none", "internet"):
            raise SandboxError(f"unknown network {network!r}", file=template, field="network")
        if network == "internet" and (server or egress):
            raise SandboxError(
                "network internet is for fresh evaluations only, not for a sandbox with a server or an egress",
                file=template,
                field="network",
            )
        sb = LocalSandbox(
            self, template, meta, timeout=timeout, env=env or {}, metadata=metadata or {}, egress=egress,
            server=server, network=network or "none",
        )  # fmt: skip
        return sb


class _LocalBackground:
    """A background command: output goes to files (no pipe to fill up), the group is killed on kill()."""

    def __init__(self, proc: subprocess.Popen, out: Path, err: Path, started: float) -> None:
        self.proc, self.out, self.err, self.started = proc, out, err, started
        self._result: CommandResult | None = None

    def poll(self) -> CommandResult | None:
        if self._result is None:
            rc = self.proc.poll()
            if rc is None:
                return None
            self._result = CommandResult(
                rc, _read_tail(self.out), _read_tail(self.err), False, time.monotonic() - self.started
            )
        return self._result

    def kill(self) -> None:
        _kill_group(self.proc)


class LocalSandbox(SandboxBase):
    def __init__(
        self,
        provider: LocalProvider,
        template: str,
        meta: dict[str, Any],
        *,
        timeout: float,
        env: dict[str, str],
        metadata: dict[str, str],
        egress: str | None = None,
        server: str = "",
        network: str = "none",
    ) -> None:
        sid = f"local-{uuid.uuid4().hex[:12]}"
        super().__init__(sid, template)
        self.metadata = dict(metadata)
        self.network = network
        self.meta = meta
        self.uid = provider.uid
        self.blackbox_token = secrets.token_urlsafe(32)
        self.egress_url: str | None = None
        self.server: _LocalBackground | None = None
        self.routes: Routes | None = None
        self._holder: _LocalBackground | None = None
        self._netns: int | None = None
        self._procs: list[subprocess.Popen] = []
        self._plock = threading.Lock()
        self._bg_ids = itertools.count()
        sandboxes = _mkdir(provider.root / "_sandboxes", 0o711, exist_ok=True)
        self.dir = sandboxes / sid
        self._record(provider.name, dir=str(self.dir))
        _mkdir(self.dir, 0o711)
        self._timer = threading.Timer(timeout, self.kill)
        self._timer.daemon = True
        self.limits: Limits | None = None
        try:
            self.limits = Limits(sid, provider.limits)
            for sub in ("tmp", "home", "run"):
                _mkdir(self.dir / sub, 0o700)
                os.chown(self.dir / sub, self.uid, self.uid)
                if sub != "run":
                    self.limits.mount_scratch(self.dir / sub, self.uid)
            _mkdir(self.dir / "bg", 0o700)  # host-only: never bound into the sandbox
            res = run_cmd(
                ["cp", "-a", str(provider.template_dir(template) / "testbed"), str(self.dir / "testbed")],
                timeout=600,
                umask=UMASK,
            )
            if res.returncode != 0:
                raise SandboxError(
                    f"copying the workspace failed: {res.stderr.strip()}", file=template, row=sid
                )
            _chown_tree(self.dir / "testbed", self.uid)
            self.env = {"PATH": _PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
            self.env.update(env)
            if server or egress:
                self._start_holder(server, egress)
        except BaseException:
            self.kill()
            raise
        self._timer.start()

    # ---- plumbing --------------------------------------------------------------------------------
    # Network: none but loopback. A sandbox with a blackbox server or an egress gets one "holder" bwrap whose
    # network namespace every command of the sandbox joins (nsenter as root, then the privilege drop): it runs
    # the in-sandbox forwarders (`sweflow.blackbox.forward`) and then execs the server. The host reaches the
    # server through `<sandbox>/run/blackbox.sock` (a host forwarder on a free 127.0.0.1 port is
    # `port_url(31000)`); sandbox processes reach the egress at `egress_url` (loopback) which the forwarder
    # pipes to `<sandbox>/run/egress.sock`, served by a host forwarder connected to the egress host:port
    # (`sweflow.sandbox.egress`). Without server and egress each command gets a fresh empty network namespace,
    # or, for a fresh evaluation created with network="internet" (never with a server or an egress), the
    # host's. The blackbox token is in the server's environment only.
    def _start_holder(self, server: str, egress: str | None) -> None:
        """The bwrap whose network namespace the sandbox's commands share: forwarders, then the server."""
        self.routes = Routes(self.dir / "run", egress=egress, blackbox=bool(server))
        eport = inside_egress_port(egress, BLACKBOX_PORT) if egress else None
        if eport:
            self.egress_url = f"http://127.0.0.1:{eport}"
        python = f"{RUNTIME_DIR}/bin/python"
        fwd = inside_forwarders(python, egress_port=eport, blackbox_port=BLACKBOX_PORT if server else None)
        script = f"{fwd}\n" + (
            f"exec /bin/bash -c {shlex.quote(server)}" if server else "exec sleep infinity"
        )
        r, w = os.pipe()
        try:
            env = {TOKEN_ENV: self.blackbox_token} if server else {}
            argv = self._argv(["/bin/bash", "-c", script], env, None, extra=["--info-fd", str(w)])
            self._holder = self._spawn_bg(argv, pass_fds=(w,))
            os.close(w)
            w = -1
            info = _read_all(r, 30)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        try:
            child = json.loads(info)["child-pid"]
            self._netns = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (ValueError, KeyError, OSError) as exc:
            raise SandboxError(
                f"the sandbox's server did not start: {self._holder_exit() or exc}",
                file=self.template,
                row=self.id,
            ) from exc
        try:
            self.routes.wait_ready(alive=lambda: self._holder.poll() is None)
        except SandboxError as exc:
            why = self._holder_exit()
            problem = f"{exc.problem} ({why})" if why else exc.problem
            raise SandboxError(problem, file=exc.file, row=self.id, hint=exc.hint) from exc
        self.routes.lock(0)  # host root: the sandbox uid (never 0) can no longer change the folder
        if server:
            self.server = self._holder

    def _holder_exit(self, wait: float = 2.0) -> str:
        """How the holder ended (its exit status and the tail of its stderr), once it has: for the error."""
        holder = self._holder
        if holder is None:
            return ""
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.proc.wait(timeout=wait)
        res = holder.poll()
        if res is None:
            return "the holder still runs"
        err = " ".join(res.stderr.split())[-300:]
        return f"holder exit {res.exit_code}" + (f", {err}" if err else "")

    # The agent is hostile. Every command is `setpriv` (uid/gid `sandbox_uid`, default 65534, no groups) in
    # front of an unprivileged `bwrap`: own user, pid, ipc, uts, cgroup and network namespaces, no
    # capabilities, no_new_privs, --die-with-parent, --new-session. The sandbox sees /usr and /etc (read-only,
    # plus the /bin /lib /sbin links), its own workspace, the shared venvs and the Claude binary read-only,
    # and nothing else of the host. The workspace belongs to the sandbox uid; bwrap resolves bind sources as
    # that uid, so the provider gives the directories above its root search permission (o+x, not listing).
    def _argv(
        self, cmd: list[str], env: dict[str, str] | None, cwd: str | None, *, extra: list[str] = ()
    ) -> list[str]:
        # again before each command: another process may have taken search permission away from a folder
        # above the workspace since (any pytest that starts makes /tmp/pytest-of-<user> 0700 again)
        _searchable(self.dir)
        join = self._netns is not None
        prefix: list[str] = self.limits.prefix() if self.limits is not None else []
        if join:
            # as root: enter the holder's network namespace, close its fd, then drop privileges.
            fd = self._netns
            prefix += [
                "nsenter",
                f"--net=/proc/self/fd/{fd}",
                "--",
                "/bin/bash",
                "-c",
                f'exec {fd}>&-; exec "$@"',
                "sh",
            ]
        own_net = not join and self.network != "internet"
        args = prefix + _bwrap(self.uid, own_net=own_net) + [
            "--bind", str(self.dir / "tmp"), "/tmp",
            "--bind", str(self.dir / "home"), "/root",
            "--bind", str(self.dir / "run"), SOCKET_DIR,
            "--tmpfs", "/opt",
            "--ro-bind", self.meta["conda"], "/opt/miniconda3",
            "--ro-bind", self.meta["runtime"], RUNTIME_DIR,
            "--bind", str(self.dir / "testbed"), "/testbed",
        ]  # fmt: skip
        if self.meta.get("claude"):
            args += ["--tmpfs", str(Path(CLAUDE_PATH).parent), "--ro-bind", self.meta["claude"], CLAUDE_PATH]
        args += list(extra) + ["--chdir", cwd or "/testbed", "--clearenv"]
        for k, v in {**self.env, **(env or {})}.items():
            args += ["--setenv", k, v]
        return args + ["--"] + cmd

    def _popen(self, argv: list[str], pass_fds: tuple[int, ...] = (), **kw: Any) -> subprocess.Popen:
        self._check_alive()
        if self._netns is not None:
            pass_fds = (*pass_fds, self._netns)
        with self._plock:
            proc = subprocess.Popen(argv, start_new_session=True, pass_fds=pass_fds, umask=UMASK, **kw)
            self._procs.append(proc)
        return proc

    def _forget(self, proc: subprocess.Popen) -> None:
        with self._plock:
            if proc in self._procs:
                self._procs.remove(proc)

    def _exec(
        self, cmd: list[str], *, timeout: float, env=None, cwd=None, input: bytes | None = None
    ) -> tuple[int, bytes, bytes, bool, float]:
        t0 = time.monotonic()
        proc = self._popen(
            self._argv(cmd, env, cwd),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
            return proc.returncode, out, err, False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return TIMEOUT_EXIT, out, err, True, time.monotonic() - t0
        finally:
            self._forget(proc)

    def _spawn_bg(self, argv: list[str], pass_fds: tuple[int, ...] = ()) -> _LocalBackground:
        n = next(self._bg_ids)
        out, err = self.dir / "bg" / f"{n}.out", self.dir / "bg" / f"{n}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = self._popen(argv, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe)
        return _LocalBackground(proc, out, err, time.monotonic())

    # ---- Sandbox API -----------------------------------------------------------------------------
    def run(self, cmd: str, *, timeout: float, env=None, cwd=None) -> CommandResult:
        """Run through bash; on timeout the process group is killed and exit_code is 124."""
        rc, out, err, timed_out, dur = self._exec(["/bin/bash", "-c", cmd], timeout=timeout, env=env, cwd=cwd)
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
        """Run `cmd` with stdout+stderr piped to the host file `log_path`; exit code = bwrap's (the command's).

        The command's pid namespace dies with it, so nothing it started outlives the call or writes later.
        """
        t0 = time.monotonic()
        proc = self._popen(
            self._argv(["/bin/bash", "-c", cmd], env, cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        sink = LogSink(log_path, max_bytes)
        reader = threading.Thread(target=sink.drain, args=(proc.stdout,), daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, timed_out = TIMEOUT_EXIT, True
        finally:
            self._forget(proc)
        reader.join(30)
        sink.close()
        return CommandResult(rc, "", "", timed_out, time.monotonic() - t0)

    def start(self, cmd: str, *, env=None, cwd=None) -> _LocalBackground:
        return self._spawn_bg(self._argv(["/bin/bash", "-c", cmd], env, cwd))

    def write_file(self, path: str, data: bytes | str, *, timeout: float = 60) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        rc, _, err, timed_out, _ = self._exec(
            ["/bin/bash", "-c", script, "w", path], timeout=timeout, input=payload
        )
        if rc != 0 or timed_out:
            raise SandboxError(
                f"write_file failed: {err.decode(errors='replace').strip()}", file=path, row=self.id
            )

    def read_file(self, path: str, *, timeout: float = 60) -> bytes:
        rc, out, err, timed_out, _ = self._exec(["/bin/cat", "--", path], timeout=timeout)
        if rc != 0 or timed_out:
            raise SandboxError(
                f"read_file failed: {err.decode(errors='replace').strip()}", file=path, row=self.id
            )
        return out

    def port_url(self, port: int) -> str:
        """The host URL of the sandbox's blackbox server (only port 31000 is reachable from the host)."""
        if port != BLACKBOX_PORT or self.routes is None or self.routes.blackbox_port is None:
            raise SandboxError(
                f"port {port} of a local sandbox is not reachable from the host",
                file=self.template,
                row=self.id,
                hint=f"only the blackbox server (:{BLACKBOX_PORT}, start_server=True) is forwarded",
            )
        return f"http://127.0.0.1:{self.routes.blackbox_port}"

    @property
    def blackbox_port(self) -> int | None:
        return self.routes.blackbox_port if self.routes else None

    def _kill(self) -> None:
        self._timer.cancel()
        with self._plock:
            procs, self._procs = list(self._procs), []
        for p in procs:
            _kill_group(p)
        if self.routes is not None:
            self.routes.close()
        if self._netns is not None:
            with contextlib.suppress(OSError):
                os.close(self._netns)
            self._netns = None
        if self.limits is not None:
            self.limits.close()  # scratch unmounted before the folder goes
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- helpers -----------------------------------------------------------------------------------------
def _read_all(fd: int, timeout: float) -> bytes:
    """Read a pipe to EOF within `timeout` seconds (bwrap's --info-fd)."""
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    return data


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the group `proc` leads, only while `proc` is unreaped: a reaped leader's pid (the group id) may
    already be another process's, such as a new sandbox's command (each leads its own group), and this
    process is root. Its sandbox's processes die with it (bwrap --die-with-parent; the pid namespace)."""
    with getattr(proc, "_waitpid_lock", contextlib.nullcontext()):  # nothing reaps it between check and kill
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _read_tail(path: Path, limit: int = 64_000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit * 4))
            return tail(fh.read().decode("utf-8", "replace"), limit)
    except FileNotFoundError:
        return ""
