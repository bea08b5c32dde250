"""The blackbox HTTP server (JSON over http.server.ThreadingHTTPServer). Standard library only.

Routes under /v1 for the status, rollout registration and sessions (messages, execute_cmd, reading, abort,
close), plus GET /health; every route but GET /health needs the per-sandbox bearer token. The full route
list sits above `_make_handler`, how the token is found above `TokenSource`.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .. import __version__
from .httpio import linger
from .sessions import ApiError, SessionManager, check_id

log = logging.getLogger("sweflow.blackbox")
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64
DEFAULT_RUNTIME_DIR = "/tmp/sweflow-bbs"
TOKEN_ENV = "SWEFLOW_BLACKBOX_TOKEN"
TOKEN_FILE_ENV = "SWEFLOW_BLACKBOX_TOKEN_FILE"
DEFAULT_TOKEN_FILE = "/run/sweflow/blackbox.token"
READ_TIMEOUT_S = 10.0


# Authentication: every route but GET /health needs `Authorization: Bearer <token>`, the per-sandbox secret
# (401 without it or with a wrong one, before any routing, so an unauthenticated caller learns nothing). The
# token comes from the constructor, else $SWEFLOW_BLACKBOX_TOKEN (removed from os.environ once read), else the
# file named by $SWEFLOW_BLACKBOX_TOKEN_FILE, else /run/sweflow/blackbox.token; a file is read on each request
# until it holds a token (on E2B it is written after the server started), then removed. With no token anywhere
# every route but /health answers 503.
class TokenSource:
    """The server's secret: given, or from the environment, or read from a file once it holds one."""

    def __init__(self, token: str | None = None, token_file: str | None = None) -> None:
        env_token = os.environ.pop(TOKEN_ENV, None)
        env_file = os.environ.pop(TOKEN_FILE_ENV, None)
        self._token = token or env_token or None
        self._file = token_file or env_file or DEFAULT_TOKEN_FILE
        self._lock = threading.Lock()
        self.get()  # a file already written is taken (and removed) before anything else can run

    def get(self) -> str | None:
        """The token, or None while none is configured (the file is re-read until it holds one).

        A token file is removed once read: the agent, which runs only after the host's first
        authenticated call, never finds it (nor the token in any process's environment)."""
        if self._token:
            return self._token
        try:
            with open(self._file, encoding="utf-8") as fh:
                value = fh.read(4096).strip()
        except OSError:
            return None
        with self._lock:
            if value and not self._token:
                self._token = value
                try:
                    os.unlink(self._file)
                except OSError as exc:
                    log.warning("could not remove the token file %s: %s", self._file, exc)
        return self._token

    def check(self, header: str | None) -> None:
        """Raise ApiError 503 (no token configured) or 401 (missing/wrong bearer token)."""
        token = self.get()
        if not token:
            raise ApiError(
                503,
                "not_configured",
                f"blackbox has no token yet: set ${TOKEN_ENV} or ${TOKEN_FILE_ENV}, or write "
                f"{DEFAULT_TOKEN_FILE}",
            )
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), token.encode("utf-8")
        ):
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <the sandbox's blackbox token>")


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
        token: str | None = None,
        token_file: str | None = None,
        read_timeout: float = READ_TIMEOUT_S,
    ) -> None:
        self.auth = TokenSource(token, token_file)
        self.read_timeout = read_timeout
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


def json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON nests at most `limit` containers deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


# Routes: GET /health, GET /v1/status, POST /v1/rollout/register, POST /v1/sessions/{id}/messages,
# POST /v1/sessions/{id}/execute_cmd, GET /v1/sessions/{id}[?tail=N&since=I&events=0],
# POST /v1/sessions/{id}/abort, POST /v1/sessions/{id}/close (also DELETE /v1/sessions/{id}).
# Errors are `{"error": {"type", "message", ...}}`.
#
# Bodies: a bad or oversized Content-Length is refused at once (400/413, connection closed); reads time out
# after `read_timeout` seconds of silence.
def _make_handler(server: BlackboxServer) -> type[BaseHTTPRequestHandler]:
    manager = server.manager

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"sweflow-blackbox/{__version__}"
        # Socket timeout for every read (headers and body): a client that stops sending is dropped.
        timeout = server.read_timeout
        _unread_body = False

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True, default=str).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if self._unread_body:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)
                if self._unread_body:
                    linger(self.connection)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                self.close_connection = True  # the client gave up (e.g. its own timeout)

        def _body(self) -> dict[str, Any]:
            if self.headers.get("Transfer-Encoding"):
                self._unread_body = True
                raise ApiError(411, "invalid_request", "send a Content-Length (chunked bodies are refused)")
            raw_length = (self.headers.get("Content-Length") or "0").strip()
            if not raw_length.isdigit():  # also refuses "-1", "+5" and "1e3"
                self._unread_body = True
                raise ApiError(400, "invalid_request", "bad Content-Length: expected a non-negative integer")
            length = int(raw_length)
            if length > MAX_BODY_BYTES:
                self._unread_body = True
                raise ApiError(413, "too_large", f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                self._unread_body = True
                raise ApiError(
                    400, "invalid_request", f"body incomplete: Content-Length {length}, read timed out"
                ) from None
            if len(raw) < length:
                self.close_connection = True
                raise ApiError(400, "invalid_request", f"body incomplete: got {len(raw)} of {length} bytes")
            if not raw.strip():
                return {}
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ApiError(400, "invalid_json", "request body must be a JSON object")
            if not json_depth_ok(body):
                raise ApiError(400, "invalid_json", f"request body nests deeper than {MAX_JSON_DEPTH}")
            return body

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            self._unread_body = method in ("POST", "DELETE")
            try:
                if path == "/health" and method == "GET":
                    self._unread_body = False
                    status, answer = 200, self._health()
                else:
                    server.auth.check(self.headers.get("Authorization"))
                    # Read the body before routing so a keep-alive connection stays in sync on a refusal.
                    body = {}
                    if method in ("POST", "DELETE"):
                        body = self._body()
                        self._unread_body = False
                    status, answer = self._route(method, path, parse_qs(url.query), body)
            except ApiError as err:
                status, answer = err.status, err.body()
            except Exception as exc:  # a bug must still answer JSON, not drop the connection
                log.exception("unhandled error on %s %s", method, url.path)
                status, answer = (
                    500,
                    {"error": {"type": "internal", "message": f"{type(exc).__name__}: {exc}"}},
                )
            self._reply(status, answer)

        def _health(self) -> dict[str, Any]:
            return {"healthy": True, "version": __version__, "token_configured": bool(server.auth.get())}

        def _route(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]):
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
