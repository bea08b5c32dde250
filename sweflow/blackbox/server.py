"""The blackbox HTTP server (JSON over http.server.ThreadingHTTPServer).

Routes: GET /health, GET /v1/status, POST /v1/rollout/register, POST /v1/sessions/{id}/messages,
POST /v1/sessions/{id}/execute_cmd, GET /v1/sessions/{id}[?tail=N&since=I&events=0],
POST /v1/sessions/{id}/abort, POST /v1/sessions/{id}/close (also DELETE /v1/sessions/{id}).
Errors are `{"error": {"type", "message", ...}}`. Standard library only.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .. import __version__
from .sessions import ApiError, SessionManager, check_id

log = logging.getLogger("sweflow.blackbox")
MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_RUNTIME_DIR = "/tmp/sweflow-bbs"


class BlackboxServer:
    """The server object: `start()` serves in a thread (tests), `serve_forever()` blocks (CLI)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        runtime_dir: str = DEFAULT_RUNTIME_DIR,
        max_sessions: int = 1,
        agent_binary: str | None = None,
        default_turn_timeout: float = 3600.0,
        default_workdir: str | None = None,
    ) -> None:
        self.manager = SessionManager(
            runtime_dir=runtime_dir,
            max_sessions=max_sessions,
            agent_binary=agent_binary,
            default_turn_timeout=default_turn_timeout,
            default_workdir=default_workdir,
        )
        self.started = time.time()
        self.httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def status(self) -> dict[str, Any]:
        return {
            **self.manager.status(),
            "version": __version__,
            "uptime": round(time.time() - self.started, 3),
        }

    def start(self) -> BlackboxServer:
        # A short poll interval keeps stop() quick (tests start and stop many servers).
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="blackbox", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.manager.abort_all()
            self.httpd.server_close()

    def stop(self) -> None:
        """Abort running work, stop serving and close the socket."""
        self.manager.abort_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> BlackboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _session_route(path: str) -> tuple[str, str | None]:
    """'/v1/sessions/<id>[/<action>]' -> (id, action or None)."""
    rest = path[len("/v1/sessions/") :]
    sid, _, action = rest.partition("/")
    return check_id(sid, "session id"), (action or None)


def _int_param(query: dict[str, list[str]], key: str) -> int | None:
    if key not in query:
        return None
    try:
        value = int(query[key][-1])
    except ValueError:
        raise ApiError(400, "invalid_request", f"{key}: expected a non-negative integer") from None
    if value < 0:
        raise ApiError(400, "invalid_request", f"{key}: expected a non-negative integer")
    return value


def _make_handler(server: BlackboxServer) -> type[BaseHTTPRequestHandler]:
    manager = server.manager

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"sweflow-blackbox/{__version__}"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True, default=str).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its own timeout); nothing to tell it

        def _body(self) -> dict[str, Any]:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise ApiError(400, "invalid_request", "bad Content-Length") from None
            if length > MAX_BODY_BYTES:
                raise ApiError(413, "too_large", f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            raw = self.rfile.read(length) if length else b""
            if not raw.strip():
                return {}
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ApiError(400, "invalid_json", "request body must be a JSON object")
            return body

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            try:
                # Read the body first so a keep-alive connection stays in sync even when we refuse.
                body = self._body() if method in ("POST", "DELETE") else {}
                status, answer = self._route(method, path, parse_qs(url.query), body)
            except ApiError as err:
                status, answer = err.status, err.body()
            except Exception as exc:  # a bug must still answer JSON, not drop the connection
                log.exception("unhandled error on %s %s", method, self.path)
                status, answer = (
                    500,
                    {"error": {"type": "internal", "message": f"{type(exc).__name__}: {exc}"}},
                )
            self._reply(status, answer)

        def _route(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]):
            if path == "/health" and method == "GET":
                return 200, {"healthy": True, "version": __version__}
            if path == "/v1/status" and method == "GET":
                return 200, server.status()
            if path == "/v1/rollout/register" and method == "POST":
                return 200, manager.register(body)
            if path.startswith("/v1/sessions/"):
                sid, action = _session_route(path)
                session = manager.get(sid)
                if action is None and method == "GET":
                    events = query.get("events", ["1"])[-1] not in ("0", "false")
                    snap = session.snapshot(
                        tail=_int_param(query, "tail"), since=_int_param(query, "since"), events=events
                    )
                    return 200, snap
                if (action is None and method == "DELETE") or (action == "close" and method == "POST"):
                    return 200, manager.close(sid)
                if method == "POST" and action == "messages":
                    return 200, session.send_message(body)
                if method == "POST" and action == "execute_cmd":
                    return 200, session.execute_cmd(body)
                if method == "POST" and action == "abort":
                    return 200, session.abort()
            raise ApiError(
                404 if method in ("GET", "POST", "DELETE") else 405, "not_found", f"no route {method} {path}"
            )

        def do_GET(self) -> None:  # noqa: N802
            self._dispatch("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._dispatch("DELETE")

    return Handler
