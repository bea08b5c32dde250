"""Docker sandboxes through the docker SDK; templates are images built from `TemplateSpec.to_dockerfile()`.

Network: "none" (default; the server is reachable only inside the container, `port_url` raises) or "host"
(no bridge exists on our hosts). Under host networking every container serves the blackbox on its own free
host port (SWEFLOW_BLACKBOX_PORT, bound to 127.0.0.1) and `port_url(31000)` returns that URL.

Commands run as `timeout -k 5 <t> bash -c CMD` through the exec API, and the client also gives up after the
timeout plus a grace period, so a hung daemon call cannot block a caller. Exit code 124 means timed out.
Background commands run detached under `setsid` and report through pid/rc/out/err files in /tmp/.sweflow-bg.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
import shlex
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SandboxError
from ..util import free_port, sha256_bytes
from .base import BLACKBOX_PORT, CommandResult, SandboxBase, TemplateRecord, tail
from .spec import TemplateSpec, artifacts_dockerfile, file_sha256

T = TypeVar("T")
GRACE = 15.0
LABEL = "sweflow.sandbox"
BG_DIR = "/tmp/.sweflow-bg"
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


class DockerProvider:
    """Options: network ("none"|"host"), cpu (cores), memory_mb, pids_limit, start_server, build_cache, client."""

    name = "docker"

    def __init__(
        self,
        *,
        network: str = "none",
        cpu: float | None = None,
        memory_mb: int | None = None,
        pids_limit: int | None = 1024,
        start_server: bool = True,
        build_cache: bool = True,
        client: Any = None,
    ) -> None:
        if network not in ("none", "host"):
            raise SandboxError(
                f"unsupported docker network {network!r}", field="network", hint="none or host"
            )
        import docker

        self.network = network
        self.cpu, self.memory_mb, self.pids_limit = cpu, memory_mb, pids_limit
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
    def create(
        self,
        template: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> DockerSandbox:
        """Start a container from the template image; its CMD (the server) runs beside a keep-alive."""
        import docker

        port = free_port() if self.network == "host" else BLACKBOX_PORT
        envs = {
            "SWEFLOW_BLACKBOX_PORT": str(port),
            "SWEFLOW_BLACKBOX_HOST": "127.0.0.1" if self.network == "host" else "0.0.0.0",
            **(env or {}),
        }
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
        keep = (
            f"({server}) >/tmp/sweflow-server.log 2>&1 & exec sleep infinity"
            if server
            else "exec sleep infinity"
        )
        kw: dict[str, Any] = {}
        if self.cpu:
            kw["nano_cpus"] = int(self.cpu * 1e9)
        if self.memory_mb:
            kw["mem_limit"] = f"{int(self.memory_mb)}m"
            kw["memswap_limit"] = f"{int(self.memory_mb)}m"
        if self.pids_limit:
            kw["pids_limit"] = self.pids_limit
        container = _call(
            lambda: self.client.containers.run(
                image=template, command=["/bin/bash", "-c", keep], detach=True, network_mode=self.network,
                environment=envs, labels=labels, auto_remove=False, init=True, working_dir="/testbed", **kw,
            ),
            120, "container start", template,
        )  # fmt: skip
        return DockerSandbox(self, container, template, port=port, timeout=timeout)


class _DockerBackground:
    def __init__(self, sb: DockerSandbox, n: int, started: float) -> None:
        self.sb, self.n, self.started = sb, n, started
        self._result: CommandResult | None = None

    def poll(self) -> CommandResult | None:
        if self._result is not None:
            return self._result
        d = f"{BG_DIR}/{self.n}"
        r = self.sb.run(f"cat {d}.rc 2>/dev/null", timeout=30)
        if not r.stdout.strip():
            return None
        out = self.sb.run(f"tail -c 64000 {d}.out", timeout=30).stdout
        err = self.sb.run(f"tail -c 64000 {d}.err", timeout=30).stdout
        self._result = CommandResult(int(r.stdout.strip()), out, err, False, time.monotonic() - self.started)
        return self._result

    def kill(self) -> None:
        """Kill the command's process group; the wrapper dies too, so record exit 137 on its behalf."""
        if not self.sb.killed:
            d = f"{BG_DIR}/{self.n}"
            self.sb.run(
                f"kill -KILL -- -$(cat {d}.pid) 2>/dev/null; sleep 0.1; [ -e {d}.rc ] || echo 137 > {d}.rc",
                timeout=30,
            )


class DockerSandbox(SandboxBase):
    def __init__(
        self, provider: DockerProvider, container: Any, template: str, *, port: int, timeout: float
    ) -> None:
        super().__init__(container.id[:12], template)
        self.provider, self.container, self.blackbox_port = provider, container, port
        self._bg = itertools.count()
        self._timer = threading.Timer(timeout, self.kill)
        self._timer.daemon = True
        self._timer.start()

    def _exec(
        self, argv: list[str], *, timeout: float, env=None, cwd=None
    ) -> tuple[int, bytes, bytes, float]:
        self._check_alive()
        api = self.provider.api_long
        t0 = time.monotonic()
        ex = _call(
            lambda: api.exec_create(self.container.id, argv, environment=env, workdir=cwd),
            60,
            "exec create",
            self.template,
            self.id,
        )

        def go() -> tuple[bytes | None, bytes | None]:
            return api.exec_start(ex["Id"], demux=True)

        try:
            out, err = _call(go, timeout + GRACE, "exec", self.template, self.id)
        except SandboxError as exc:
            if "timed out" not in str(exc):
                raise
            return 124, b"", b"client-side timeout", time.monotonic() - t0
        rc = _call(lambda: api.exec_inspect(ex["Id"]), 60, "exec inspect", self.template, self.id)["ExitCode"]
        return (rc if rc is not None else -1), out or b"", err or b"", time.monotonic() - t0

    def run(self, cmd: str, *, timeout: float, env=None, cwd=None) -> CommandResult:
        """Run through bash under `timeout`; exit_code 124 with timed_out=True when it ran out of time."""
        t = max(1, math.ceil(timeout))
        rc, out, err, dur = self._exec(
            ["timeout", "-k", "5", str(t), "/bin/bash", "-c", cmd], timeout=timeout, env=env, cwd=cwd
        )
        timed_out = rc == 124 and dur >= timeout * 0.98
        return CommandResult(
            rc, tail(out.decode("utf-8", "replace")), tail(err.decode("utf-8", "replace")), timed_out, dur
        )

    def start(self, cmd: str, *, env=None, cwd=None) -> _DockerBackground:
        n = next(self._bg)
        d = f"{BG_DIR}/{n}"
        wrapper = (
            f'mkdir -p {BG_DIR}; echo $$ > {d}.pid; /bin/bash -c "$1" > {d}.out 2> {d}.err; '
            f"echo $? > {d}.rc.tmp; mv {d}.rc.tmp {d}.rc"
        )
        self._check_alive()
        api = self.provider.api_long
        ex = _call(
            lambda: api.exec_create(
                self.container.id,
                ["setsid", "/bin/bash", "-c", wrapper, "bg", cmd],
                environment=env,
                workdir=cwd,
            ),
            60,
            "exec create",
            self.template,
            self.id,
        )
        _call(lambda: api.exec_start(ex["Id"], detach=True), 60, "exec start", self.template, self.id)
        return _DockerBackground(self, n, time.monotonic())

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
        if self.provider.network != "host":
            raise SandboxError(
                f"port {port} is not reachable from the host with network=none",
                file=self.template,
                row=self.id,
                hint="use network=host, or curl from inside the sandbox",
            )
        return f"http://127.0.0.1:{self.blackbox_port if port == BLACKBOX_PORT else port}"

    def _kill(self) -> None:
        self._timer.cancel()
        try:
            _call(lambda: self.container.remove(force=True), 60, "container remove", self.template, self.id)
        except SandboxError as exc:
            if "No such container" not in str(exc) and "is already in progress" not in str(exc):
                raise


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
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def new_id() -> str:
    return uuid.uuid4().hex[:12]
