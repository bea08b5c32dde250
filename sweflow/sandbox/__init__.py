"""Sandboxes: one provider interface, three backends (local, docker, e2b)."""

from .base import (
    BLACKBOX_PORT,
    BackgroundCommand,
    CommandResult,
    Provider,
    Sandbox,
    SandboxBase,
    TemplateRecord,
)

__all__ = [
    "BLACKBOX_PORT",
    "BackgroundCommand",
    "CommandResult",
    "Provider",
    "Sandbox",
    "SandboxBase",
    "TemplateRecord",
]
