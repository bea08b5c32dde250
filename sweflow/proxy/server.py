"""The token-recording proxy: an Anthropic Messages endpoint in front of an Engine.

Sessions are explicit: the rollout dispatcher calls `POST /session/create {"session_id": ...}` before the
agent starts (set `ProxyConfig.implicit_sessions` to create them on first use instead). A Messages request
names its session by `Authorization: Bearer <id>`, `x-api-key: <id>`, or a `/sessions/<id>` path prefix
(the prefix wins); it can reach nothing else. Unknown session -> 404, finalized -> 409, no id -> 401.

Threading: one thread per connection (ThreadingHTTPServer); the engine call runs in a worker pool with a
timeout and holds no proxy-wide lock. Tokenisation shares one lock because fast tokenizers are not
re-entrant. `POST /pause` holds new Messages requests before they reach the engine until `POST /resume`;
requests already generating finish (pause with {"wait_idle": true} returns once none is in flight).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sweflow.proxy import anthropic as an
from sweflow.proxy.engines import Engine, EngineTimeout, GenerateResult, SamplingParams
from sweflow.proxy.recorder import LinearizeConfig, SessionRecord, Turn
from sweflow.proxy.toolcalls import parse_tool_calls

log = logging.getLogger("sweflow.proxy")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_BODY_BYTES = 64 << 20


@dataclass
class ProxyConfig:
    """Server behaviour. Sampling comes from here unless `honor_request_sampling` (RL needs the trainer's)."""

    max_new_tokens: int = 16000
    max_context_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    honor_request_sampling: bool = False
    engine_timeout_s: float = 600.0
    pause_timeout_s: float | None = None
    implicit_sessions: bool = False
    midlist_system: str = "system"  # role for mid-list system messages; falls back to "user" if refused
    admin_token: str | None = None
    stop_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    linearize: LinearizeConfig = field(default_factory=LinearizeConfig)
    max_workers: int = 256


class HttpError(Exception):
    """An error answered as an Anthropic-style JSON body with this status."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def default_stop_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's eos plus <|im_end|>/<|endoftext|> when they exist."""
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|endoftext|>"):
        if tok in vocab and vocab[tok] not in ids:
            ids.append(int(vocab[tok]))
    return ids


class ProxyServer:
    """Serve the proxy on host:port (0 = free port) in a background thread: `with ProxyServer(...) as p:`.

    The session/trajectory/pause methods are the same operations the HTTP admin endpoints perform.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        config: ProxyConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or ProxyConfig()
        self.stop_ids = list(self.config.stop_token_ids or default_stop_ids(tokenizer))
        self._sessions: dict[str, SessionRecord] = {}
        self._sessions_lock = threading.Lock()
        self._tok_lock = threading.Lock()
        self._gate = threading.Condition()
        self._paused = False
        self._stopping = False
        self._in_flight = 0
        self.weight_version: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.config.max_workers, thread_name_prefix="engine"
        )
        self._httpd = _Server((host, port), _Handler)
        self._httpd.proxy = self
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ProxyServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="proxy-http", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        with self._gate:
            self._stopping = True
            self._gate.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ sessions
    def create_session(self, session_id: str, metadata: dict | None = None) -> bool:
        """Create a session; False when it already exists (idempotent). 409 if it was finalized."""
        _check_session_id(session_id)
        with self._sessions_lock:
            existing = self._sessions.get(session_id)
            if existing is not None:
                if existing.finalized:
                    raise HttpError(409, "invalid_request_error", f"session {session_id!r} is finalized")
                return False
            self._sessions[session_id] = SessionRecord(session_id, metadata)
            return True

    def session(self, session_id: str, *, for_messages: bool = False) -> SessionRecord:
        with self._sessions_lock:
            rec = self._sessions.get(session_id)
            if rec is None and for_messages and self.config.implicit_sessions:
                rec = self._sessions[session_id] = SessionRecord(session_id)
        if rec is None:
            raise HttpError(404, "not_found_error", f"unknown session {session_id!r}")
        if for_messages and rec.finalized:
            raise HttpError(409, "invalid_request_error", f"session {session_id!r} is finalized")
        return rec

    def finalize_session(self, session_id: str) -> int:
        rec = self.session(session_id)
        rec.finalized = True
        return rec.num_turns()

    def read_trajectory(self, session_id: str, drain: bool = False) -> dict:
        return self.session(session_id).read(drain=drain, config=self.config.linearize)

    def delete_session(self, session_id: str) -> None:
        with self._sessions_lock:
            self._sessions.pop(session_id, None)

    # ------------------------------------------------------------------ pause
    def pause(self, wait_idle: bool = False, timeout: float = 600.0) -> dict:
        with self._gate:
            self._paused = True
            if wait_idle:
                self._gate.wait_for(lambda: self._in_flight == 0, timeout=timeout)
            return {"paused": True, "in_flight": self._in_flight}

    def resume(self, weight_version: int | None = None) -> dict:
        with self._gate:
            if weight_version is not None:
                self.weight_version = weight_version
            self._paused = False
            self._gate.notify_all()
            return {"paused": False, "in_flight": self._in_flight, "weight_version": self.weight_version}

    def _enter_gate(self) -> None:
        with self._gate:
            ok = self._gate.wait_for(
                lambda: not self._paused or self._stopping, timeout=self.config.pause_timeout_s
            )
            if self._stopping or not ok:
                raise HttpError(503, "overloaded_error", "proxy is paused or stopping; retry later")
            self._in_flight += 1

    def _leave_gate(self, _future: object = None) -> None:
        with self._gate:
            self._in_flight -= 1
            self._gate.notify_all()

    # ------------------------------------------------------------------ messages
    def render(self, req: an.MessagesRequest) -> list[int]:
        """Request -> prompt token ids through the tokenizer's chat template."""
        tools = an.to_chat_tools(req.tools) or None
        kwargs = self.config.chat_template_kwargs
        chat = an.to_chat_messages(req.system, req.messages, midlist_system=self.config.midlist_system)
        try:
            text = self.tokenizer.apply_chat_template(
                chat, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja raise_exception and friends: the conversation is not renderable
            # Some templates (Qwen3.5) refuse a system message after the first; Claude Code sends them.
            chat = an.to_chat_messages(req.system, req.messages, midlist_system="user")
            try:
                text = self.tokenizer.apply_chat_template(
                    chat, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
                )
            except Exception:
                raise HttpError(
                    400, "invalid_request_error", f"chat template rejected the messages: {exc}"
                ) from exc
            log.info("chat template refused mid-list system messages; rendered them as user messages")
        with self._tok_lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count_tokens(self, body: Any) -> dict:
        req = an.parse_request(body, require_max_tokens=False)
        return {"input_tokens": len(self.render(req))}

    def _sampling(self, req: an.MessagesRequest, prompt_len: int) -> SamplingParams:
        cfg = self.config
        max_tokens = min(req.max_tokens, cfg.max_new_tokens)
        if cfg.max_context_tokens is not None:
            room = cfg.max_context_tokens - prompt_len
            if room <= 0:
                raise HttpError(
                    400,
                    "invalid_request_error",
                    f"prompt is too long: {prompt_len} tokens > {cfg.max_context_tokens} maximum",
                )
            max_tokens = min(max_tokens, room)
        temp, top_p, top_k = cfg.temperature, cfg.top_p, cfg.top_k
        if cfg.honor_request_sampling:
            temp = req.temperature if req.temperature is not None else temp
            top_p = req.top_p if req.top_p is not None else top_p
            top_k = req.top_k if req.top_k is not None else top_k
        return SamplingParams(
            max_tokens=max_tokens, temperature=temp, top_p=top_p, top_k=top_k, stop_token_ids=self.stop_ids
        )

    def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        self._enter_gate()
        try:
            future = self._pool.submit(self.engine.generate, prompt_ids, sampling)
        except RuntimeError as exc:  # pool shut down
            self._leave_gate()
            raise HttpError(503, "overloaded_error", "proxy is stopping") from exc
        future.add_done_callback(self._leave_gate)
        try:
            return future.result(timeout=self.config.engine_timeout_s)
        except (concurrent.futures.TimeoutError, EngineTimeout) as exc:
            raise HttpError(
                504, "timeout_error", f"engine timed out: {exc or self.config.engine_timeout_s}"
            ) from exc
        except HttpError:
            raise
        except Exception as exc:
            log.warning("engine error: %s", exc)
            raise HttpError(502, "api_error", f"engine error: {type(exc).__name__}: {exc}") from exc

    def decode(self, output_ids: list[int]) -> str:
        ids = list(output_ids)
        while ids and ids[-1] in self.stop_ids:
            ids.pop()
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def handle_messages(self, session_id: str, body: Any) -> tuple[dict, SessionRecord, int]:
        """Run one Messages request for a session; return (response message, session, turn index)."""
        received = time.time()
        rec = self.session(session_id, for_messages=True)
        req = an.parse_request(body)
        prompt_ids = self.render(req)
        sampling = self._sampling(req, len(prompt_ids))
        rendered = time.time()
        index = rec.next_index()
        result = self._generate(prompt_ids, sampling)
        generated = time.time()
        parsed = parse_tool_calls(self.decode(result.output_ids), req.tools)
        blocks = an.content_blocks(parsed.text, parsed.tool_calls) or [{"type": "text", "text": ""}]
        stop_reason = an.stop_reason_for(result.finish_reason, bool(parsed.tool_calls))
        message = an.build_message(
            model=req.model,
            blocks=blocks,
            stop_reason=stop_reason,
            input_tokens=len(prompt_ids),
            output_tokens=len(result.output_ids),
        )
        timings = {
            "received": received,
            "render_s": rendered - received,
            "generate_s": generated - rendered,
            "total_s": time.time() - received,
        }
        turn = Turn(
            index=index,
            prompt_ids=prompt_ids,
            output_ids=list(result.output_ids),
            logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
            timings=timings,
            stop_reason=stop_reason,
            model=req.model,
            weight_version=self.weight_version,
        )
        rec.add(turn)
        return message, rec, index


def _check_session_id(session_id: Any) -> None:
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise HttpError(
            400, "invalid_request_error", "session_id must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    proxy: ProxyServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

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
        _check_session_id(sid)
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
