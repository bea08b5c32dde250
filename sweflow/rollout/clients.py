"""HTTP clients the dispatcher talks through: the token-recording proxy's admin API and the blackbox server.

`ProxyClient` is the Protocol, `HttpProxyClient` the real proxy client and `BlackboxClient` the in-sandbox
server's. Both raise `ProxyError` / `SandboxError` with one-line messages; a transport failure (connection
refused, reset, timeout) is `TransportError`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

from sweflow.errors import ProxyError, SandboxError, SweflowError


# Both raise `ProxyError` / `SandboxError` with one-line messages; a transport failure (connection refused,
# reset, timeout) is `TransportError`, so the dispatcher can tell "the server answered no" from "it is gone".
class TransportError(SweflowError):
    """The HTTP peer could not be reached or dropped the connection (no answer at all)."""


class HttpStatusError(SweflowError):
    """The peer answered with an HTTP error status; `status`, `error_type` and `body` say which."""

    def __init__(self, problem: str, *, status: int, error_type: str, body: Any, **kw: Any) -> None:
        super().__init__(problem, **kw)
        self.status, self.error_type, self.body = status, error_type, body


def http_json(
    url: str, body: Any = None, *, method: str | None = None, timeout: float, headers: dict | None = None
) -> Any:
    """POST (body given) or GET `url` with JSON; return the decoded answer.

    Raises HttpStatusError for an HTTP error answer, TransportError when no answer came.
    """
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method or ("POST" if data else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - our own servers
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"raw": raw[:500].decode("utf-8", "replace")}
        err = answer.get("error") if isinstance(answer, dict) else None
        kind = str(err.get("type", "")) if isinstance(err, dict) else ""
        msg = str(err.get("message", "")) if isinstance(err, dict) else str(answer)[:300]
        raise HttpStatusError(
            f"HTTP {exc.code} {kind}: {msg}".strip(), status=exc.code, error_type=kind, body=answer, file=url
        ) from None
    except (OSError, urllib.error.URLError) as exc:  # refused, reset, timed out, DNS
        reason = getattr(exc, "reason", exc)
        raise TransportError(f"no answer: {type(reason).__name__}: {reason}", file=url) from None
    try:
        return json.loads(raw) if raw else {}
    except ValueError as exc:
        raise TransportError(f"answer is not JSON: {exc}", file=url) from None


# `ProxyClient` is the Protocol (a trainer may hand in its own, e.g. one that calls an in-process
# `ProxyServer` directly).
class ProxyClient(Protocol):
    """The proxy operations one rollout needs; `url` is where the proxy listens (as seen by the caller)."""

    url: str

    def create_session(self, session_id: str, metadata: dict[str, Any] | None = None) -> str:
        """Create the session (idempotent) and return its bearer token for the agent."""
        ...

    def finalize_session(self, session_id: str) -> int: ...

    def read_trajectory(self, session_id: str) -> dict[str, Any]: ...

    def delete_session(self, session_id: str) -> None: ...


# `HttpProxyClient` is the real one over `/session/*` and `/trajectory/read`, with the proxy's admin token.
# `create_session` returns the session's own secret: the agent's only credential.
class HttpProxyClient:
    """The proxy's admin endpoints over HTTP; `admin_token` is the proxy's (every admin call needs it)."""

    def __init__(self, url: str, *, admin_token: str | None = None, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            return http_json(self.url + path, body, timeout=self.timeout, headers=self._headers)
        except (HttpStatusError, TransportError) as exc:
            raise ProxyError(f"proxy {path} failed: {exc.problem}", row=body.get("session_id")) from exc

    def create_session(self, session_id: str, metadata: dict[str, Any] | None = None) -> str:
        answer = self._post("/session/create", {"session_id": session_id, "metadata": metadata or {}})
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise ProxyError("proxy /session/create answered no session token", row=session_id)
        return token

    def finalize_session(self, session_id: str) -> int:
        return int(self._post("/session/finalize", {"session_id": session_id}).get("num_turns", 0))

    def read_trajectory(self, session_id: str) -> dict[str, Any]:
        return self._post("/trajectory/read", {"session_id": session_id})

    def delete_session(self, session_id: str) -> None:
        self._post("/session/delete", {"session_id": session_id})


# `BlackboxClient` speaks to the in-sandbox server at the URL the sandbox provider gives for port 31000 and
# sends the sandbox's blackbox token on every call but /health.
class BlackboxClient:
    """The in-sandbox blackbox server's API (see sweflow.blackbox.server) at `base_url`.

    `token` (the sandbox's `blackbox_token`) goes out as `Authorization: Bearer` on every call but /health.
    """

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _call(self, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        return http_json(self.base_url + path, body, timeout=timeout or self.timeout, headers=self._headers)

    def wait_healthy(self, timeout: float, *, interval: float = 0.25) -> dict[str, Any]:
        """Poll GET /health until it answers healthy; SandboxError with the last problem after `timeout`."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            try:
                answer = http_json(self.base_url + "/health", timeout=min(5.0, self.timeout))
                if isinstance(answer, dict) and answer.get("healthy") is True:
                    return answer
                last = f"unhealthy answer {answer!r:.200}"
            except SweflowError as exc:
                last = exc.problem
            if time.monotonic() >= deadline:
                raise SandboxError(f"blackbox not healthy after {timeout:.0f}s: {last}", file=self.base_url)
            time.sleep(interval)

    def status(self) -> dict[str, Any]:
        return self._call("/v1/status")

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("/v1/rollout/register", body)

    def execute_cmd(self, session_id: str, cmd: str, *, timeout: float) -> dict[str, Any]:
        """Run `cmd` in the session's working directory; the answer has stdout, stderr, returncode, timed_out."""
        return self._call(
            f"/v1/sessions/{session_id}/execute_cmd", {"cmd": cmd, "timeout": timeout}, timeout=timeout + 30
        )

    def send_message(self, session_id: str, content: str, *, timeout: float) -> dict[str, Any]:
        """One synchronous agent turn (the server kills the agent after `timeout`)."""
        return self._call(
            f"/v1/sessions/{session_id}/messages",
            {"content": content, "timeout": timeout},
            timeout=timeout + 60,
        )

    def session(self, session_id: str) -> dict[str, Any]:
        """The session snapshot with every stored stream-json event."""
        return self._call(f"/v1/sessions/{session_id}")

    def abort(self, session_id: str) -> dict[str, Any]:
        return self._call(f"/v1/sessions/{session_id}/abort", {})
