"""HTTP plumbing of the proxy: routing, authentication, bounded body reading, JSON/SSE writing, errors.

`ProxyHandler` only parses and writes; every decision is a `ProxyServer` method (`server.proxy`). A
request refused before its body was read (bad or too large Content-Length, chunked) is answered at once
and the connection closed.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sweflow.blackbox.httpio import linger
from sweflow.blackbox.server import MAX_JSON_DEPTH, json_depth_ok
from sweflow.proxy import anthropic as an

log = logging.getLogger("sweflow.proxy")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


class HttpError(Exception):
    """An error answered as an Anthropic-style JSON body with this status."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def check_session_id(session_id: Any) -> None:
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise HttpError(
            400, "invalid_request_error", "session_id must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )


class ProxyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    proxy: Any  # the ProxyServer


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyHTTPServer

    _unread_body = False

    def setup(self) -> None:
        super().setup()
        # Every read (request line, headers, body) times out: a silent client cannot hold a thread forever.
        self.connection.settimeout(self.server.proxy.config.read_timeout_s)
        # Headers and body go out in separate writes; without NODELAY, Nagle + delayed ACK add ~40 ms a call.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: Any) -> None:  # the default writes every request to stderr
        log.debug("%s %s", self.address_string(), fmt % args)

    # ------------------------------------------------------------------ plumbing
    def _send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self._unread_body:  # what follows on this connection is an unread body, not a request
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _refuse_unread(self, status: int, error_type: str, message: str) -> HttpError:
        """An error for a request whose body stays unread: the connection closes after the answer."""
        self._unread_body = True
        return HttpError(status, error_type, message)

    def _read_json(self) -> Any:
        if self.headers.get("Transfer-Encoding"):
            raise self._refuse_unread(
                411, "invalid_request_error", "send a Content-Length (no chunked bodies)"
            )
        raw_length = (self.headers.get("Content-Length") or "0").strip()
        if not raw_length.isdigit():  # also refuses "-1", "+5", "1e3"
            raise self._refuse_unread(400, "invalid_request_error", "missing or invalid Content-Length")
        length, limit = int(raw_length), self.server.proxy.config.max_body_bytes
        if length > limit:
            raise self._refuse_unread(
                413, "request_too_large", f"request body of {length} bytes exceeds {limit} bytes"
            )
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise self._refuse_unread(400, "invalid_request_error", "request body timed out") from None
        self._unread_body = False
        if len(raw) < length:
            self.close_connection = True
            raise HttpError(400, "invalid_request_error", f"body incomplete: {len(raw)} of {length} bytes")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError) as exc:
            msg = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise HttpError(400, "invalid_request_error", f"body is not valid JSON: {msg}") from None
        if not json_depth_ok(body):
            raise HttpError(400, "invalid_request_error", f"body nests deeper than {MAX_JSON_DEPTH} levels")
        return body

    def _bearer(self) -> str:
        auth = self.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return self.headers.get("x-api-key", "").strip()

    def _session_from_request(self, path: str) -> tuple[str, str]:
        """(session id, API path): the session whose token the request carries; a /sessions/<id> prefix
        must name that same session."""
        proxy = self.server.proxy
        sid = proxy.session_for_token(self._bearer())
        if sid is None:
            raise self._refuse_unread(
                401, "authentication_error", "send Authorization: Bearer <session token> (or x-api-key)"
            )
        m = re.match(r"^/sessions/([^/]+)(/.*)$", path)
        if m:
            named, path = m.group(1), m.group(2)
            if named != sid:
                raise self._refuse_unread(
                    403, "permission_error", "the token does not belong to the session in the path"
                )
        return sid, path

    def _check_admin(self) -> None:
        auth = self.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not self.server.proxy.is_admin(token):
            raise self._refuse_unread(401, "authentication_error", "admin endpoint needs the admin token")

    def _send_error(self, status: int, error_type: str, message: str) -> None:
        try:
            self._send_json(status, an.error_body(error_type, message))
        except OSError:
            self.close_connection = True
            return
        if self._unread_body:
            self.wfile.flush()
            linger(self.connection)

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_json(200, {"healthy": True, "paused": self.server.proxy._paused})
        else:
            self._send_json(404, an.error_body("not_found_error", f"no route GET {path}"))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        proxy = self.server.proxy
        self._unread_body = True
        try:
            # Authenticate before reading a byte of the body: a stranger's body is never read or parsed.
            if path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens"):
                sid, api_path = self._session_from_request(path)
                body = self._read_json()
                if api_path == "/v1/messages/count_tokens":
                    proxy.session(sid, for_messages=True)
                    self._send_json(200, proxy.count_tokens(body, self.headers))
                elif api_path == "/v1/messages":
                    self._messages(sid, body)
                else:
                    raise HttpError(404, "not_found_error", f"no route POST {path}")
                return
            self._check_admin()
            self._admin(path, self._read_json())
        except an.RequestError as exc:
            self._send_error(400, "invalid_request_error", str(exc))
        except HttpError as exc:
            self._send_error(exc.status, exc.error_type, exc.message)
        except RecursionError:
            self._send_error(400, "invalid_request_error", "request nests too deeply")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # never let one request take the server down
            log.exception("proxy internal error")
            self._send_error(500, "api_error", f"internal error: {type(exc).__name__}")

    def _admin(self, path: str, body: Any) -> None:
        proxy = self.server.proxy
        if not isinstance(body, dict):
            raise HttpError(400, "invalid_request_error", "body must be a JSON object")
        if path == "/pause":
            out = proxy.pause(bool(body.get("wait_idle", False)), float(body.get("timeout", 600.0)))
            self._send_json(200, out)
            return
        if path == "/resume":
            wv = body.get("weight_version")
            self._send_json(200, proxy.resume(int(wv) if wv is not None else None))
            return
        sid = body.get("session_id")
        check_session_id(sid)
        if path == "/session/create":
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
            self._send_json(200, proxy.create_session(sid, meta))
        elif path == "/session/finalize":
            self._send_json(
                200, {"session_id": sid, "finalized": True, "num_turns": proxy.finalize_session(sid)}
            )
        elif path == "/trajectory/read":
            self._send_json(200, proxy.read_trajectory(sid, drain=bool(body.get("drain", False))))
        elif path == "/session/delete":
            proxy.delete_session(sid)
            self._send_json(200, {"session_id": sid, "deleted": True})
        else:
            raise HttpError(404, "not_found_error", f"no route POST {path}")

    def _messages(self, sid: str, body: Any) -> None:
        proxy = self.server.proxy
        message, rec, index = proxy.handle_messages(sid, body, self.headers)
        try:
            if isinstance(body, dict) and body.get("stream"):
                frames = [an.format_sse(ev, data) for ev, data in an.sse_events(message)]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(sum(len(f) for f in frames)))
                self.end_headers()
                for frame in frames:
                    self.wfile.write(frame)
                    self.wfile.flush()
            else:
                self._send_json(200, message)
        except OSError:
            # The agent went away: keep the turn (it was generated) but mark it so linearisation skips it.
            rec.mark_aborted(index)
            self.close_connection = True
            log.info("client of session %s disconnected; turn %d marked aborted", sid, index)
