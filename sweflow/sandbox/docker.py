"""Docker sandboxes through the docker SDK; templates are images built from `TemplateSpec.to_dockerfile()`.

The agent is hostile: no network, no capabilities, resource limits, no engine socket; one socket folder
at /run/sweflow is the way in and out (see above `DockerProvider`). Templates are built by
`sweflow.sandbox.docker_template`; the running sandbox is `sweflow.sandbox.docker_sandbox`.
"""

from __future__ import annotations

import logging
import secrets
import shlex
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..schema import default
from .base import BLACKBOX_PORT
from .docker_api import _call
from .docker_sandbox import DISK_POLL_S, DockerSandbox
from .docker_template import DockerTemplates
from .egress import SOCKET_DIR, Routes, inside_egress_port, inside_forwarders
from .spec import RUNTIME_DIR

log = logging.getLogger("sweflow.sandbox.docker")

LABEL = "sweflow.sandbox"
TOKEN_ENV = "SWEFLOW_BLACKBOX_TOKEN"
TOKEN_FILE_ENV = "SWEFLOW_BLACKBOX_TOKEN_FILE"


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


# The agent is hostile. Containers run with network "none" (loopback only; host networking is gone), every
# capability dropped (`cap_add` gives some back), no-new-privileges, and pids/memory/CPU limits, and no engine
# socket. The one way in and out is a per-sandbox host folder bound at /run/sweflow: the host reaches the
# blackbox server through `blackbox.sock` (a host forwarder on a free 127.0.0.1 port is `port_url(31000)`),
# and the sandbox reaches the egress at `egress_url` (an in-container forwarder on loopback, piped to
# `egress.sock`, which a host forwarder connects to the egress host:port); see `sweflow.sandbox.egress`. The
# in-container forwarders run on the template's runtime python. The server is started by its own `docker
# exec`; the blackbox token reaches it in a file it removes once read.
#
# Templates are built by `sweflow.sandbox.docker_template`; the running sandbox (commands, files, the disk
# watchdog) is `sweflow.sandbox.docker_sandbox`.
class DockerProvider(DockerTemplates):
    """Options (defaults: the schema's sandbox.docker): cpu (cores), memory_mb, pids_limit, file_size_mb
    (the largest file, RLIMIT_FSIZE), disk_mb (the writable layer's size where the storage driver can cap
    it), cap_add (capabilities given back after dropping all; default none), start_server, build_cache,
    client, internet_network (the Docker network of a create(network="internet")). Containers get network
    "none" unless a fresh evaluation asks for internet; the host reaches the server through port_url, the
    sandbox the proxy through egress."""

    name = "docker"

    def __init__(
        self,
        *,
        cpu: float | None = default("sandbox.docker.cpus"),
        memory_mb: int | None = default("sandbox.docker.mem_mb"),
        pids_limit: int | None = default("sandbox.docker.pids_limit"),
        cap_add: tuple[str, ...] | list[str] = (),
        start_server: bool = True,
        build_cache: bool = True,
        client: Any = None,
        internet_network: str = default("sandbox.network.docker_network"),
        file_size_mb: int | None = default("sandbox.docker.file_size_mb"),
        disk_mb: int | None = default("sandbox.docker.disk_mb"),
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


def _server_cmd(cmd: list[str] | None) -> str:
    """The image CMD as a shell string (unwrapping our own `bash -c X`)."""
    if not cmd:
        return ""
    if len(cmd) == 3 and cmd[0] in ("/bin/bash", "bash", "/bin/sh", "sh") and cmd[1] == "-c":
        return cmd[2]
    if cmd in (["/bin/bash"], ["bash"], ["/bin/sh"], ["sh"]):
        return ""  # a plain task image: nothing to serve
    return shlex.join(cmd)


def new_id() -> str:
    return uuid.uuid4().hex[:12]
