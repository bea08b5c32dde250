"""Sandboxes: one provider interface, three backends (local, docker, e2b).

It owns the `Provider`/`Sandbox` protocol (`base`), the backends, the lookup by name or from the typed
`sandbox` settings (`settings`, `registry.provider_from_config`), template specs, builds, artifacts and smoke
tests, the egress to the proxy, and the ledger that reaps what killed runs left behind.
"""

from .base import (
    BLACKBOX_PORT,
    BackgroundCommand,
    CommandResult,
    Provider,
    Sandbox,
    SandboxBase,
    TemplateRecord,
)

# The backends and their modules: `local`: unprivileged bubblewrap, over `local_bwrap` and `local_template`;
# `docker` over `docker_api`, `docker_sandbox` and `docker_template`; `e2b` over `e2b_api` and `e2b_template`.

__all__ = [
    "BLACKBOX_PORT",
    "BackgroundCommand",
    "CommandResult",
    "Provider",
    "Sandbox",
    "SandboxBase",
    "TemplateRecord",
]
