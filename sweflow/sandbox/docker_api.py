"""The Docker engine under a deadline: each blocking docker SDK call runs in a thread (`_call`).

The caller gives up after `timeout` seconds, so a hung daemon call cannot block it; a failure comes back as
one SandboxError naming the call. Template builds, the provider and its sandboxes all call through it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import SandboxError

T = TypeVar("T")


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
