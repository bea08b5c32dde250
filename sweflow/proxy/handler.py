"""HTTP plumbing of the proxy: routing, session binding from the request, JSON/SSE writing, error mapping.

`ProxyHandler` only parses and writes; every decision is a `ProxyServer` method (`server.proxy`).
"""

from __future__ import annotations

import json
import logging
import re
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sweflow.proxy import anthropic as an

log = logging.getLogger("sweflow.proxy")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_BODY_BYTES = 64 << 20


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

    def setup(self) -> None:
        super().setup()
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
        self.end_headers()
        self.wfile.write(data)

    def _read_json(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise HttpError(400, "invalid_request_error", "missing or invalid Content-Length")
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            raise HttpError(400, "invalid_request_error", f"body is not valid JSON: {exc}") from exc

    def _session_from_request(self, path: str) -> tuple[str, str]:
        """(session id, API path) from a /sessions/<id> prefix or the bearer token / x-api-key."""
        m = re.match(r"^/sessions/([^/]+)(/.*)$", path)
        if m:
            sid, path = m.group(1), m.group(2)
        else:
            auth = self.headers.get("Authorization", "")
            sid = (
                auth[7:].strip()
                if auth.lower().startswith("bearer ")
                else self.headers.get("x-api-key", "").strip()
            )
        if not sid:
            raise HttpError(
                401, "authentication_error", "no session: send Authorization: Bearer <session id>"
            )
        if not SESSION_ID_RE.match(sid):
            raise HttpError(401, "authentication_error", "malformed session id")
        return sid, path

    def _check_admin(self) -> None:
        token = self.server.proxy.config.admin_token
        if token and self.headers.get("Authorization", "") != f"Bearer {token}":
            raise HttpError(401, "authentication_error", "admin endpoint needs the admin token")

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
        try:
            body = self._read_json()
            if path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens"):
                sid, api_path = self._session_from_request(path)
                if api_path == "/v1/messages/count_tokens":
                    proxy.session(sid, for_messages=True)
                    self._send_json(200, proxy.count_tokens(body))
                elif api_path == "/v1/messages":
                    self._messages(sid, body)
                else:
                    raise HttpError(404, "not_found_error", f"no route POST {path}")
                return
            self._check_admin()
            self._admin(path, body)
        except an.RequestError as exc:
            self._send_json(400, an.error_body("invalid_request_error", str(exc)))
        except HttpError as exc:
            self._send_json(exc.status, an.error_body(exc.error_type, exc.message))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # never let one request take the server down
            log.exception("proxy internal error")
            try:
                self._send_json(500, an.error_body("api_error", f"internal error: {type(exc).__name__}"))
            except OSError:
                self.close_connection = True

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
            created = proxy.create_session(sid, meta)
            self._send_json(200, {"session_id": sid, "created": created})
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
        message, rec, index = proxy.handle_messages(sid, body)
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
