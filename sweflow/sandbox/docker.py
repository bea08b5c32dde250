"""Docker sandboxes through the docker SDK; templates are images built from `TemplateSpec.to_dockerfile()`.

The agent is hostile. Containers run with network "none" (loopback only; host networking is gone), every
capability dropped (`cap_add` gives some back), no-new-privileges, and pids/memory/CPU limits, and no
engine socket. The one way in and out is a per-sandbox host folder bound at /run/sweflow: the host
reaches the blackbox server through `blackbox.sock` (a host forwarder on a free 127.0.0.1 port is
`port_url(31000)`), and the sandbox reaches the egress at `egress_url` (an in-container forwarder on
loopback, piped to `egress.sock`, which a host forwarder connects to the egress host:port); see
`sweflow.sandbox.egress`. The in-container forwarders run on the template's runtime python. The server
is started by its own `docker exec`; the blackbox token reaches it in a file it removes once read.

Commands run as `timeout -k 5 <t> bash -c CMD` through the exec API, and the client also gives up after the
timeout plus a grace period, so a hung daemon call cannot block a caller. Exit code 124 means timed out;
exit codes always come from exec_inspect, never from a file the sandbox could write. Background commands
run detached under `setsid -w` with their output in /tmp/.sweflow-bg (informational tails).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math
import re
import secrets
import shlex
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SandboxError
from ..util import sha256_bytes
from .base import (
    BLACKBOX_PORT,
    LOGGED_MAX_BYTES,
    TIMEOUT_EXIT,
    CommandResult,
    SandboxBase,
    TemplateRecord,
    tail,
)
from .egress import SOCKET_DIR, Routes, inside_egress_port, inside_forwarders
from .logged import LogSink
from .spec import RUNTIME_DIR, TemplateSpec, artifacts_dockerfile, file_sha256

log = logging.getLogger("sweflow.sandbox.docker")

T = TypeVar("T")
GRACE = 15.0
LABEL = "sweflow.sandbox"
BG_DIR = "/tmp/.sweflow-bg"
DISK_POLL_S = 5.0  # how often a sandbox's writable layer is measured where the driver cannot cap it
TOKEN_ENV = "SWEFLOW_BLACKBOX_TOKEN"
TOKEN_FILE_ENV = "SWEFLOW_BLACKBOX_TOKEN_FILE"
KILLED_EXIT = 137
# After run_logged's command ended: kill every process but PID 1 (the init) and the ones the sandbox was
# created with (keep-alive, forwarders; their pids recorded at start), so nothing it left keeps writing.
_KILL_REST = (
    'for p in /proc/[0-9]*; do p=${p#/proc/}; case " 1 $$ $1 " in *" $p "*) ;; *) kill -9 $p 2>/dev/null;;'
    " esac; done; true"
)
_artifact_lock = threading.Lock()


def _call(fn: Callable[[], T], timeout: float, what: str, template: str = "", sid: str = "") -> T:
    """Run a blocking docker call in a thread and give up after `timeout` seconds."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["e"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        raise SandboxError(f"{what} timed out after {timeout:.0f}s", file=template or None, row=sid or None)
    if "e" in box:
        exc = box["e"]
        if isinstance(exc, SandboxError):
            raise exc
        raise SandboxError(f"{what} failed: {exc}", file=template or None, row=sid or None) from exc
    return box["v"]


def docker_network_mode(network: str | None, internet: str, *, server: bool, egress: str | None) -> str:
    """The ``docker run --network`` of a sandbox: "none", or ``internet`` for a fresh evaluation that asks."""
    if network in (None, "none"):
        return "none"
    if network != "internet":
        raise SandboxError(f"unknown network {network!r}", field="network")
    if server or egress:
        raise SandboxError(
            "network internet is for fresh evaluations only, not for a sandbox with a server or an egress",
            field="network",
        )
    return internet


class DockerProvider:
    """Options: cpu (cores, default 2), memory_mb (4096), pids_limit (1024), file_size_mb (the largest
    file, RLIMIT_FSIZE: 2048), disk_mb (the writable layer's size where the storage driver can cap it:
    8192), cap_add (capabilities given back after dropping all;
    default none), start_server, build_cache, client, internet_network (the Docker network of a
    create(network="internet"), default "bridge"). Containers get network "none" unless a
    fresh evaluation asks for internet; the host reaches the server through port_url, the sandbox the
    proxy through egress."""

    name = "docker"

    def __init__(
        self,
        *,
        cpu: float | None = 2,
        memory_mb: int | None = 4096,
        pids_limit: int | None = 1024,
        cap_add: tuple[str, ...] | list[str] = (),
        start_server: bool = True,
        build_cache: bool = True,
        client: Any = None,
        internet_network: str = "bridge",
        file_size_mb: int | None = 2048,
        disk_mb: int | None = 8192,
    ) -> None:
        import docker

        self.internet_network = internet_network
        self.cpu, self.memory_mb, self.pids_limit = cpu, memory_mb, pids_limit
        self.file_size_mb, self.disk_mb = file_size_mb, disk_mb
        self._disk_opt_ok: bool | None = None  # whether the storage driver takes a size (learnt once)
        self.cap_add = [str(c).upper() for c in cap_add]
        self.start_server = start_server
        self.build_cache = build_cache
        try:
            self.client = client or docker.from_env(timeout=120, max_pool_size=64)
            # exec_start and builds stream for as long as the command runs; their deadline is ours.
            self.api_long = docker.from_env(timeout=None, max_pool_size=64).api
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot reach the Docker engine: {exc}", hint="is dockerd running?") from exc

    # ---- templates -------------------------------------------------------------------------------
    def artifact_images(self, spec: TemplateSpec) -> dict[str, str]:
        """Build (once per file checksum) a scratch image per artifact; templates COPY --from them.

        One image per file, so a changed wheel (every source edit) never re-stores the 400 MB binary.
        """
        out: dict[str, str] = {}
        for f in (spec.claude_binary, spec.runtime_wheel):
            if f is None:
                continue
            name = Path(f).name
            digest = sha256_bytes(name + "\0" + file_sha256(f))[:16]
            tag = f"sweflow-artifacts:{re.sub(r'[^a-z0-9]+', '-', name.lower())[:40]}-{digest}"
            with _artifact_lock:
                if not self._image_exists(tag):
                    with tempfile.TemporaryDirectory(prefix="sweflow-artifacts-") as ctx:
                        _link_or_copy(Path(f), Path(ctx) / name)
                        (Path(ctx) / "Dockerfile").write_text(artifacts_dockerfile([name]))
                        self._build(ctx, tag, what=f"artifacts image {name}", timeout=1800)
            out[name] = tag
        return out

    def build(self, spec: TemplateSpec, name: str, *, timeout: float = 1800) -> TemplateRecord:
        """docker build of the spec's Dockerfile on its task image; the image tag is the template name.

        The image a rebuild replaces is removed (best effort) so rebuilt templates do not pile up.
        """
        if not self._image_exists(spec.image):
            raise SandboxError(
                "task image not found", file=spec.image, field="FROM", hint="build or load it first"
            )
        arts = self.artifact_images(spec)
        old = self._image_id(name)
        with tempfile.TemporaryDirectory(prefix="sweflow-build-") as ctx:
            (Path(ctx) / "Dockerfile").write_text(spec.to_dockerfile(artifacts_image=arts))
            image_id = self._build(ctx, name, what=f"template {name}", timeout=timeout, image=spec.image)
        if old and old != image_id:
            with contextlib.suppress(Exception):
                self.client.images.remove(old)
        return TemplateRecord(
            image=spec.image, provider=self.name, template=name, spec_hash=spec.spec_hash(),
            build_id=image_id, digest=image_id, extra={"artifact_images": dict(sorted(arts.items()))},
        )  # fmt: skip

    def _image_id(self, tag: str) -> str:
        try:
            return self.client.images.get(tag).id if self._image_exists(tag) else ""
        except Exception:  # noqa: BLE001 - only used for cleanup
            return ""

    def has_template(self, name: str) -> bool:
        return self._image_exists(name)

    def _image_exists(self, tag: str) -> bool:
        import docker

        try:
            _call(lambda: self.client.images.get(tag), 60, f"inspect image {tag}")
            return True
        except SandboxError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound):
                return False
            raise

    def _build(self, ctx: str, tag: str, *, what: str, timeout: float, image: str = "") -> str:
        """Stream a classic build; errors name the Dockerfile step that failed."""
        state = {"step": "context", "log": []}

        def go() -> str:
            stream = self.api_long.build(
                path=ctx,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="host",
                decode=True,
                nocache=not self.build_cache,
            )
            for chunk in stream:
                text = chunk.get("stream", "")
                if text.startswith("Step "):
                    state["step"] = text.strip()
                if text.strip():
                    state["log"] = (state["log"] + [text.strip()])[-20:]
                if "error" in chunk:
                    detail = " | ".join(state["log"][-3:])
                    raise SandboxError(
                        f"{what}: {state['step']} failed: {chunk['error'].strip()} [{detail[-300:]}]",
                        file=image or tag,
                        field="build",
                    )
            return self.client.images.get(tag).id

        try:
            return _call(go, timeout, f"{what}: docker build ({state['step']})", template=image or tag)
        except SandboxError as exc:
            if "timed out" in str(exc):
                raise SandboxError(
                    f"{what}: {state['step']} timed out after {timeout:.0f}s",
                    file=image or tag,
                    field="build",
                ) from exc
            raise

    # ---- sandboxes -------------------------------------------------------------------------------
    def _disk_limits(self) -> dict[str, Any]:
        """The file-size rlimit (no file above file_size_mb) and no core files. (No tmpfs: the archive API
        that write_file and read_file use does not see into one.)"""
        import docker

        kw: dict[str, Any] = {}
        ulimits = [docker.types.Ulimit(name="core", soft=0, hard=0)]
        if self.file_size_mb:
            size = int(self.file_size_mb) * 1024 * 1024
            ulimits.append(docker.types.Ulimit(name="fsize", soft=size, hard=size))
        kw["ulimits"] = ulimits
        return kw

    def _run_with_disk_cap(self, run: Any) -> Any:
        """``run`` with the writable layer capped at disk_mb where the storage driver can (learnt on the
        first create); elsewhere without, and a one-line warning."""
        import docker

        if not self.disk_mb or self._disk_opt_ok is False:
            return run()
        try:
            container = run(storage_opt={"size": f"{int(self.disk_mb)}M"})
        except docker.errors.APIError as exc:
            if not _disk_cap_refused(exc):
                raise
            self._disk_opt_ok = False
            log.warning(
                "docker: the storage driver takes no size (%s); each sandbox's writable layer is measured "
                "every %.0f s instead, and the sandbox killed past %s MB (each file is capped at %s MB)",
                str(exc).strip()[:200],
                DISK_POLL_S,
                self.disk_mb,
                self.file_size_mb,
            )
            return run()
        self._disk_opt_ok = True
        return container

    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        egress: str | None = None,
        network: str | None = None,
    ) -> DockerSandbox:
        """Start a container from the template image (a keep-alive with the forwarders), then its server
        (the image CMD) in its own exec. ``network`` "internet" joins ``internet_network`` (fresh
        evaluations only: refused with a server or an egress); None or "none": network "none"."""
        import docker

        labels = {LABEL: "1", "sweflow.template": template}
        labels.update({f"sweflow.meta.{k}": str(v) for k, v in (metadata or {}).items()})
        try:
            img = _call(lambda: self.client.images.get(template), 60, "inspect template", template)
        except SandboxError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound):
                raise SandboxError(
                    "template image not found", file=template, hint="run build_template"
                ) from exc
            raise
        server = _server_cmd(img.attrs.get("Config", {}).get("Cmd")) if self.start_server else ""
        network_mode = docker_network_mode(network, self.internet_network, server=bool(server), egress=egress)
        folder = Path(tempfile.mkdtemp(prefix="sweflow-docker-"))
        routes = None
        try:
            routes = Routes(folder, egress=egress, blackbox=bool(server))
            eport = inside_egress_port(egress, BLACKBOX_PORT) if egress else None
            python = f"{RUNTIME_DIR}/bin/python"
            fwd = inside_forwarders(
                python, egress_port=eport, blackbox_port=BLACKBOX_PORT if server else None
            )
            keep = (
                f"if [ -x {python} ]; then\n{fwd}\nfi\nexec sleep infinity" if fwd else "exec sleep infinity"
            )
            kw: dict[str, Any] = {}
            if self.cpu:
                kw["nano_cpus"] = int(self.cpu * 1e9)
            if self.memory_mb:
                kw["mem_limit"] = f"{int(self.memory_mb)}m"
                kw["memswap_limit"] = f"{int(self.memory_mb)}m"
            if self.pids_limit:
                kw["pids_limit"] = self.pids_limit
            if self.cap_add:
                kw["cap_add"] = list(self.cap_add)
            kw.update(self._disk_limits())

            def run(**extra: Any) -> Any:
                return self.client.containers.run(
                    image=template, command=["/bin/bash", "-c", keep], detach=True, network_mode=network_mode,
                    environment=dict(env or {}), labels=labels, auto_remove=False, init=True,
                    working_dir="/testbed", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                    volumes={str(folder): {"bind": SOCKET_DIR, "mode": "rw"}}, **kw, **extra,
                )  # fmt: skip

            container = _call(lambda: self._run_with_disk_cap(run), 120, "container start", template)
        except BaseException:
            if routes is not None:
                routes.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        sb = DockerSandbox(self, container, template, timeout=timeout, routes=routes, folder=folder)
        sb.egress_url = f"http://127.0.0.1:{eport}" if eport else None
        try:
            if routes is not None:
                routes.wait_ready(alive=lambda: sb._running())
                # the container's root is uid 0 without capabilities: a folder owned by another uid is
                # read-only to it
                routes.lock(65534)
            sb._record_base_pids()
            if server:
                # The token goes in a file the server removes once read, not in the environment: the
                # exec's wrapper (setsid -w) keeps its environment readable in /proc for the container's root.
                token_file = f"/run/sweflow-token-{secrets.token_hex(8)}"
                sb.write_file(token_file, sb.blackbox_token)
                sb.server = sb.start(
                    f"exec /bin/bash -c {shlex.quote(server)} >/tmp/sweflow-server.log 2>&1",
                    env={TOKEN_FILE_ENV: token_file},
                )
        except BaseException:
            sb.kill()
            raise
        return sb


def _disk_cap_refused(exc: Exception) -> bool:
    """Whether the daemon refused ``storage_opt size`` (a storage driver or backing filesystem without
    quotas: overlay2 needs xfs with pquota)."""
    text = str(exc).lower()
    return "storage-opt" in text or "storage opt" in text or "quota" in text


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
        provider: DockerProvider,
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
        r = self.run(f"mkdir -p {shlex.quote(parent)}", timeout=timeout)
        if not r.ok:
            raise SandboxError(f"write_file: mkdir failed: {r.stderr.strip()}", file=path, row=self.id)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(payload))
        ok = _call(
            lambda: self.container.put_archive(parent, buf.getvalue()), timeout, "write_file", path, self.id
        )
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


def _server_cmd(cmd: list[str] | None) -> str:
    """The image CMD as a shell string (unwrapping our own `bash -c X`)."""
    if not cmd:
        return ""
    if len(cmd) == 3 and cmd[0] in ("/bin/bash", "bash", "/bin/sh", "sh") and cmd[1] == "-c":
        return cmd[2]
    if cmd in (["/bin/bash"], ["bash"], ["/bin/sh"], ["sh"]):
        return ""  # a plain task image: nothing to serve
    return shlex.join(cmd)


def _link_or_copy(src: Path, dst: Path) -> None:
    import os

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def new_id() -> str:
    return uuid.uuid4().hex[:12]
