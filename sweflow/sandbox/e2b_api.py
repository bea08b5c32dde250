"""The E2B control plane as sweflow calls it: the connection settings and the one retry policy.

`E2BApi` holds the API key (it never appears in a message or log line) and the SDK settings, and runs
every SDK call under the retry policy. Sandboxes (`sweflow.sandbox.e2b.E2BProvider`, a subclass) and
template builds (`sweflow.sandbox.e2b_template`) both go through it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from e2b import AuthenticationException, RateLimitException, ServiceBusyException, TimeoutException

from ..errors import SandboxError
from ..util import redact, retry

T = TypeVar("T")


class _Transient(Exception):
    """A failure worth another try (5xx, 429, timeouts, dropped connections)."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (attribute or "NNN:" message prefix), or None."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    m = re.match(r"(\d{3}):", str(exc))
    return int(m.group(1)) if m else None


def is_transient(exc: BaseException) -> bool:
    """Whether an SDK error is worth retrying: timeouts, connection faults, 429 and 5xx answers."""
    if isinstance(exc, (httpx.TimeoutException, httpx.TransportError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, (TimeoutException, RateLimitException, ServiceBusyException)):
        return True
    if isinstance(exc, AuthenticationException):
        return False
    status = status_of(exc)
    return status is not None and (status >= 500 or status == 429)


# `E2BApi` holds the API key (from the argument or E2B_API_KEY; it never appears in a message or log line) and
# the SDK settings, gives the keyword arguments of every SDK call (`api_params`) and runs each call under the
# retry policy (`call`): `attempts` tries with backoff on 5xx, 429 and timeouts; a 4xx (unknown template, bad
# key) fails at once.
class E2BApi:
    """Connection settings and the retry policy for E2B control-plane calls.

    `request_timeout` bounds each control-plane request (create, kill, build calls), `attempts`
    is the number of tries for transient faults. `api_url`/`sandbox_url`/`debug` are for tests
    and self-hosted deployments; leave them None to use the SDK's environment variables.
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        domain: str | None = None,
        request_timeout: float = 30.0,
        attempts: int = 3,
        backoff: float = 1.0,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        debug: bool | None = None,
    ) -> None:
        self._api_key = api_key or os.environ.get("E2B_API_KEY") or ""
        if not self._api_key:
            raise SandboxError("no E2B API key", field="E2B_API_KEY", hint="set E2B_API_KEY or pass api_key")
        self.domain = domain
        self.request_timeout = request_timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.debug = debug

    def api_params(self, request_timeout: float | None = None) -> dict[str, Any]:
        """Keyword arguments (the SDK's ApiParams) for every SDK call; holds the key: do not log."""
        opts: dict[str, Any] = {
            "api_key": self._api_key,
            "request_timeout": self.request_timeout if request_timeout is None else request_timeout,
            "retries": 0,
        }
        for key in ("domain", "api_url", "sandbox_url", "debug"):
            value = getattr(self, key)
            if value is not None:
                opts[key] = value
        return opts

    def clean(self, exc: BaseException | str) -> str:
        """An error text safe to show: one line, the API key redacted."""
        text = str(exc) or type(exc).__name__
        return " ".join(redact(text, [self._api_key]).split())

    def call(self, fn: Callable[[], T], *, what: str, file: str | None = None, row: str | None = None) -> T:
        """Run one SDK call with the retry policy; permanent faults and exhausted tries raise SandboxError."""

        def once() -> T:
            try:
                return fn()
            except SandboxError:
                raise
            except Exception as exc:  # noqa: BLE001 - every SDK fault is classified here
                if is_transient(exc):
                    raise _Transient(f"{type(exc).__name__}: {self.clean(exc)}") from exc
                raise SandboxError(f"{what} failed: {self.clean(exc)}", file=file, row=row) from exc

        try:
            return retry(
                once,
                attempts=self.attempts,
                backoff=self.backoff,
                retry_on=(_Transient,),
                give_up_on=(SandboxError,),
                what=what,
            )
        except _Transient as exc:
            raise SandboxError(
                f"{what} failed after {self.attempts} attempts: {exc}",
                file=file,
                row=row,
                hint="the E2B service is unavailable or slow; retry later",
            ) from exc
