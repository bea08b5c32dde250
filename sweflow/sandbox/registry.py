"""Provider lookup by name or from the `sandbox` settings (`sweflow.sandbox.settings`); backends are imported
lazily so e.g. the local one needs no docker SDK."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Provider
from .settings import SandboxSettings

PROVIDERS = ("local", "docker", "e2b")


def get_provider(name: str, **options: Any) -> Provider:
    """The provider called `name` ("local", "docker" or "e2b") constructed with `options`."""
    if name == "local":
        from .local import LocalProvider

        return LocalProvider(**options)
    if name == "docker":
        from .docker import DockerProvider

        return DockerProvider(**options)
    if name == "e2b":
        from .e2b import E2BProvider

        return E2BProvider(**options)
    raise ConfigError(
        f"unknown sandbox provider {name!r}", field="sandbox.provider", hint=f"one of {PROVIDERS}"
    )


def provider_from_config(name: str, settings: SandboxSettings, *, purpose: str = "run") -> Provider:
    """The provider named `name`, configured from the `sandbox` settings, for one purpose:

    - "run": agent sandboxes (the blackbox server started; egress to the proxy only, given at create);
    - "build": template builds (Docker: no network namespace of their own);
    - "eval": fresh evaluations (no network and no blackbox server: grading needs neither); offline unless
      a create call asks for ``network="internet"`` (``sweflow.grading.evaluate.eval_network``), which on
      Docker joins ``sandbox.network.docker_network``.
    """
    server = {} if purpose == "run" else {"start_server": False}
    if name == "local":
        loc = settings.local
        # no root given: the provider's own (a caller's folder, not the workflow's relative default)
        provider = get_provider("local", templates_root=loc.templates_root, limits=loc.limits(), **server)
    elif name == "docker":
        d = settings.docker
        provider = get_provider(
            "docker",
            cpu=d.cpus,
            memory_mb=d.mem_mb,
            pids_limit=d.pids_limit,
            file_size_mb=d.file_size_mb,
            disk_mb=d.disk_mb,
            **server,
        )
    else:
        provider = get_provider(name)
    docker_network = settings.network.docker_network
    if purpose == "eval" and docker_network and hasattr(provider, "internet_network"):
        provider.internet_network = docker_network
    return provider
