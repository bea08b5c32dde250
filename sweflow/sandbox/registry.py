"""Provider lookup by name; backends are imported lazily so e.g. the local one needs no docker SDK."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Provider

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
