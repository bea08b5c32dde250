"""A fake envd (the agent inside every E2B sandbox) that runs commands for real on this host.

It serves, on one 127.0.0.1 port for all fake sandboxes (the SDK names the sandbox in the
`E2b-Sandbox-Id` header when `E2B_SANDBOX_URL` is set):
- the Connect services `process.Process` and `filesystem.Filesystem`, through the server stubs that
  ship in the e2b wheel (`ProcessWSGIApplication`, `FilesystemWSGIApplication`);
- `GET/POST /files` (download / multipart or octet-stream upload) and `GET /health`.

Each sandbox has a work dir: the default cwd and $HOME of its commands; relative paths (and /run/sweflow) resolve
against it, absolute paths are host paths (tests only use their own temp dirs). Commands run as
`/bin/bash -l -c CMD` in their own process group; a Connect deadline kills the group, as envd does.
A client that disconnects does not kill its process (background commands rely on that).
"""

from __future__ import annotations

import contextlib
import email.parser
import json
import os
import shutil
import signal
import stat as stat_mod
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fpb
from e2b.envd.filesystem.filesystem_connect import FilesystemWSGIApplication
from e2b.envd.process import process_pb as ppb
from e2b.envd.process.process_connect import ProcessWSGIApplication
from protobuf import Oneof

from .wsgi_server import WSGIServer

ENVD_VERSION = "0.6.7"
SANDBOX_MARK = "FAKE_E2B_SANDBOX"
PRIVATE_RUN = "/run/sweflow"


class _Proc:
    """One started process: its output as an append-only event log that any number of streams follow."""

    def __init__(self, popen: subprocess.Popen, config: ppb.ProcessConfig, tag: str) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.config = config
        self.tag = tag
        self.events: list[ppb.ProcessEvent] = []
        self.done = False
        self.cond = threading.Condition()
        readers = [
            threading.Thread(target=self._read, args=(popen.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(popen.stderr, "stderr"), daemon=True),
        ]
        for t in readers:
            t.start()
        threading.Thread(target=self._wait, args=(readers,), daemon=True).start()

    def _push(self, ev: ppb.ProcessEvent, done: bool = False) -> None:
        with self.cond:
            self.events.append(ev)
            self.done = self.done or done
            self.cond.notify_all()

    def _read(self, pipe: Any, name: str) -> None:
        fd = pipe.fileno()
        while chunk := os.read(fd, 65536):
            data = ppb.ProcessEvent.DataEvent(output=Oneof(name, chunk))
            self._push(ppb.ProcessEvent(event=Oneof("data", data)))
        pipe.close()

    def _wait(self, readers: list[threading.Thread]) -> None:
        rc = self.popen.wait()
        for t in readers:
            t.join()
        if rc < 0:  # killed by a signal: Go's ExitCode() is -1 then
            end = ppb.ProcessEvent.EndEvent(
                exit_code=-1, exited=False, status=f"signal: {signal.Signals(-rc).name}"
            )
        else:
            end = ppb.ProcessEvent.EndEvent(exit_code=rc, exited=True, status=f"exit status {rc}")
        self._push(ppb.ProcessEvent(event=Oneof("end", end)), done=True)

    def follow(self, start: int = 0):
        """Yield events from index `start` until the end event."""
        i = start
        while True:
            with self.cond:
                while i >= len(self.events) and not self.done:
                    self.cond.wait(0.5)
                batch = self.events[i:]
                finished = self.done
            yield from batch
            i += len(batch)
            if finished and i >= len(self.events):
                return

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


@dataclass
class FakeSandbox:
    sandbox_id: str
    token: str
    workdir: Path
    envs: dict[str, str] = field(default_factory=dict)
    procs: dict[int, _Proc] = field(default_factory=dict)

    def resolve(self, path: str) -> Path:
        """Relative paths resolve in the work dir; /run/sweflow (the token folder) is private to the sandbox
        too (the host's /run must never be written); other absolute paths are host paths."""
        p = Path(path or ".")
        if p.is_absolute() and (p == Path(PRIVATE_RUN) or Path(PRIVATE_RUN) in p.parents):
            return self.workdir / p.relative_to("/")
        return p if p.is_absolute() else self.workdir / p


def _start_event(pid: int) -> ppb.ProcessEvent:
    return ppb.ProcessEvent(event=Oneof("start", ppb.ProcessEvent.StartEvent(pid=pid)))


def _entry(path: Path) -> fpb.EntryInfo:
    st = path.lstat()
    if stat_mod.S_ISLNK(st.st_mode):
        ftype = fpb.FileType.SYMLINK
    elif stat_mod.S_ISDIR(st.st_mode):
        ftype = fpb.FileType.DIRECTORY
    else:
        ftype = fpb.FileType.FILE
    return fpb.EntryInfo(
        name=path.name,
        type=ftype,
        path=str(path),
        size=st.st_size,
        mode=stat_mod.S_IMODE(st.st_mode),
        permissions=stat_mod.filemode(st.st_mode),
        owner="user",
        group="user",
    )


class FakeEnvd:
    """Holds the fake sandboxes and serves envd's API for all of them; use as a context manager."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="fake-envd-"))
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.stopped = False
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []  # (sandbox id, path) of every request, for tests
        self._process_app = ProcessWSGIApplication(_ProcessService(self))
        self._fs_app = FilesystemWSGIApplication(_FilesystemService(self))
        self.server = WSGIServer(self._app)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> FakeEnvd:
        self.server.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
        for sid in list(self.sandboxes):
            self.remove_sandbox(sid)
        self.server.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> FakeEnvd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- sandboxes -------------------------------------------------------------------------------
    def add_sandbox(self, sandbox_id: str, token: str, envs: dict[str, str] | None = None) -> FakeSandbox:
        if self.stopped:  # a slow create answered after the test ended
            raise RuntimeError("fake envd is stopped")
        workdir = self.root / sandbox_id
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        sb = FakeSandbox(sandbox_id, token, workdir, dict(envs or {}))
        with self._lock:
            self.sandboxes[sandbox_id] = sb
        return sb

    def remove_sandbox(self, sandbox_id: str) -> bool:
        with self._lock:
            sb = self.sandboxes.pop(sandbox_id, None)
        if sb is None:
            return False
        for proc in sb.procs.values():
            proc.signal(signal.SIGKILL)
        _kill_marked(sandbox_id)
        shutil.rmtree(sb.workdir, ignore_errors=True)
        return True

    def sandbox_for(self, headers: Any) -> FakeSandbox:
        sid = headers.get("e2b-sandbox-id", "")
        sb = self.sandboxes.get(sid)
        if sb is None:
            raise ConnectError(Code.UNAVAILABLE, f"The sandbox {sid} was not found")
        return sb

    # -- HTTP ------------------------------------------------------------------------------------
    def _app(self, environ: dict[str, Any], start_response: Any):
        path = environ["PATH_INFO"]
        sid = environ.get("HTTP_E2B_SANDBOX_ID", "")
        self.requests.append((sid, path))
        if path == "/health":
            start_response("204 No Content", [])
            return [b""]
        sb = self.sandboxes.get(sid)
        if sb is None:
            return _json(
                start_response, "502 Bad Gateway", {"code": 502, "message": f"sandbox {sid} not found"}
            )
        if environ.get("HTTP_X_ACCESS_TOKEN") != sb.token:
            return _json(start_response, "401 Unauthorized", {"code": 401, "message": "invalid access token"})
        if path.startswith("/process.Process/"):
            return self._process_app(environ, start_response)
        if path.startswith("/filesystem.Filesystem/"):
            return self._fs_app(environ, start_response)
        if path == "/files":
            return self._files(sb, environ, start_response)
        return _json(start_response, "404 Not Found", {"code": 404, "message": f"no route {path}"})

    def _files(self, sb: FakeSandbox, environ: dict[str, Any], start_response: Any):
        query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
        body = environ["wsgi.input"].read()
        if environ["REQUEST_METHOD"] == "GET":
            target = sb.resolve(query.get("path", ""))
            if not target.exists():
                return _json(
                    start_response, "404 Not Found", {"code": 404, "message": f"path '{target}' not found"}
                )
            if target.is_dir():
                return _json(
                    start_response, "400 Bad Request", {"code": 400, "message": f"path '{target}' is a dir"}
                )
            start_response("200 OK", [("Content-Type", "application/octet-stream")])
            return [target.read_bytes()]
        ctype = environ.get("CONTENT_TYPE", "")
        if ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser().parsebytes(
                b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
            )
            parts = [(p.get_filename() or "", p.get_payload(decode=True) or b"") for p in msg.get_payload()]
            if len(parts) == 1 and query.get("path"):
                parts = [(query["path"], parts[0][1])]
        else:
            parts = [(query.get("path", ""), body)]
        written = []
        for name, data in parts:
            target = sb.resolve(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append({"name": target.name, "type": "file", "path": str(target)})
        return _json(start_response, "200 OK", written)


def _json(start_response: Any, status: str, obj: Any) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json")])
    return [json.dumps(obj).encode()]


def _kill_marked(sandbox_id: str) -> None:
    """Kill every host process whose environment carries this sandbox's mark (daemonized ones too)."""
    needle = f"{SANDBOX_MARK}={sandbox_id}".encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes() + b"\0":
                os.kill(int(entry.name), signal.SIGKILL)


class _ProcessService:
    """envd's process.Process service (ProcessSync protocol from the wheel's stubs)."""

    def __init__(self, envd: FakeEnvd) -> None:
        self.envd = envd

    def _proc(self, ctx: Any, selector: ppb.ProcessSelector | None) -> _Proc:
        sb = self.envd.sandbox_for(ctx.request_headers)
        sel = selector.selector if selector is not None else None
        for proc in sb.procs.values():
            if sel is not None and (
                (sel.field == "pid" and proc.pid == sel.value)
                or (sel.field == "tag" and proc.tag == sel.value)
            ):
                return proc
        raise ConnectError(Code.NOT_FOUND, f"process {sel.value if sel else '?'} not found")

    def start(self, request: ppb.StartRequest, ctx: Any):
        sb = self.envd.sandbox_for(ctx.request_headers)
        cfg = request.process or ppb.ProcessConfig()
        cwd = sb.resolve(cfg.cwd) if cfg.cwd else sb.workdir
        if not cwd.is_dir():
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{cfg.cwd}' does not exist")
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(sb.workdir),
            "TMPDIR": str(sb.workdir / "tmp"),
            "LANG": "C.UTF-8",
            "USER": "user",
            SANDBOX_MARK: sb.sandbox_id,
            **sb.envs,
            **dict(cfg.envs or {}),
        }
        popen = subprocess.Popen(
            [cfg.cmd, *cfg.args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if request.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        proc = _Proc(popen, cfg, request.tag or "")
        sb.procs[proc.pid] = proc
        if ctx.timeout_ms:
            # envd bounds the process by the stream's deadline
            timer = threading.Timer(ctx.timeout_ms / 1000.0, proc.signal, args=(signal.SIGKILL,))
            timer.daemon = True
            timer.start()
        yield ppb.StartResponse(event=_start_event(proc.pid))
        for ev in proc.follow(0):
            yield ppb.StartResponse(event=ev)

    def connect(self, request: ppb.ConnectRequest, ctx: Any):
        proc = self._proc(ctx, request.process)
        with proc.cond:
            start = len(proc.events)
        yield ppb.ConnectResponse(event=_start_event(proc.pid))
        for ev in proc.follow(start):
            yield ppb.ConnectResponse(event=ev)

    def list(self, request: ppb.ListRequest, ctx: Any) -> ppb.ListResponse:
        sb = self.envd.sandbox_for(ctx.request_headers)
        running = [p for p in sb.procs.values() if not p.done]
        return ppb.ListResponse(
            processes=[ppb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag or None) for p in running]
        )

    def send_signal(self, request: ppb.SendSignalRequest, ctx: Any) -> ppb.SendSignalResponse:
        proc = self._proc(ctx, request.process)
        if proc.done:
            raise ConnectError(Code.NOT_FOUND, f"process {proc.pid} not found")
        sig = signal.SIGKILL if request.signal == ppb.Signal.SIGKILL else signal.SIGTERM
        proc.signal(sig)
        return ppb.SendSignalResponse()

    def send_input(self, request: ppb.SendInputRequest, ctx: Any) -> ppb.SendInputResponse:
        proc = self._proc(ctx, request.process)
        if proc.popen.stdin is None:
            raise ConnectError(Code.FAILED_PRECONDITION, "stdin is not enabled for this process")
        data = request.input.input.value if request.input and request.input.input else b""
        proc.popen.stdin.write(data)
        proc.popen.stdin.flush()
        return ppb.SendInputResponse()

    def close_stdin(self, request: ppb.CloseStdinRequest, ctx: Any) -> ppb.CloseStdinResponse:
        proc = self._proc(ctx, request.process)
        if proc.popen.stdin is not None:
            proc.popen.stdin.close()
        return ppb.CloseStdinResponse()

    def update(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "pty is not supported by the fake envd")

    def stream_input(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "stream_input is not supported by the fake envd")


class _FilesystemService:
    """The subset of envd's filesystem.Filesystem service that the SDK's files module uses."""

    def __init__(self, envd: FakeEnvd) -> None:
        self.envd = envd

    def _path(self, ctx: Any, path: str) -> Path:
        return self.envd.sandbox_for(ctx.request_headers).resolve(path)

    def stat(self, request: fpb.StatRequest, ctx: Any) -> fpb.StatResponse:
        p = self._path(ctx, request.path)
        if not p.exists() and not p.is_symlink():
            raise ConnectError(Code.NOT_FOUND, f"path '{p}' not found")
        return fpb.StatResponse(entry=_entry(p))

    def make_dir(self, request: fpb.MakeDirRequest, ctx: Any) -> fpb.MakeDirResponse:
        p = self._path(ctx, request.path)
        if p.exists():
            raise ConnectError(Code.ALREADY_EXISTS, f"path '{p}' already exists")
        p.mkdir(parents=True)
        return fpb.MakeDirResponse(entry=_entry(p))

    def move(self, request: fpb.MoveRequest, ctx: Any) -> fpb.MoveResponse:
        src, dst = self._path(ctx, request.source), self._path(ctx, request.destination)
        if not src.exists():
            raise ConnectError(Code.NOT_FOUND, f"path '{src}' not found")
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
        return fpb.MoveResponse(entry=_entry(dst))

    def list_dir(self, request: fpb.ListDirRequest, ctx: Any) -> fpb.ListDirResponse:
        p = self._path(ctx, request.path)
        if not p.is_dir():
            raise ConnectError(Code.NOT_FOUND, f"directory '{p}' not found")
        depth = max(1, request.depth or 1)
        entries = [_entry(c) for c in sorted(p.rglob("*")) if len(c.relative_to(p).parts) <= depth]
        return fpb.ListDirResponse(entries=entries)

    def remove(self, request: fpb.RemoveRequest, ctx: Any) -> fpb.RemoveResponse:
        p = self._path(ctx, request.path)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            raise ConnectError(Code.NOT_FOUND, f"path '{p}' not found")
        return fpb.RemoveResponse()

    def watch_dir(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "watching is not supported by the fake envd")

    create_watcher = get_watcher_events = remove_watcher = watch_dir


def wait_until(pred: Any, timeout: float = 5.0) -> bool:
    """Poll `pred` until it is true or `timeout` passes (test helper)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())
