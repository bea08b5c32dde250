"""The token-recording proxy: an Anthropic Messages endpoint in front of an Engine.

`ProxyServer` serves the admin endpoints (sessions, trajectories, pause/resume) and Messages, each session
behind its own bearer token; prompts are built by `sweflow.proxy.prompting`, generation runs on the engine in
a worker pool, and every turn is recorded (`sweflow.proxy.recorder`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sweflow.proxy import anthropic as an
from sweflow.proxy.engines import Engine, EngineTimeout, GenerateResult, SamplingParams
from sweflow.proxy.handler import HttpError, ProxyHandler, ProxyHTTPServer, check_session_id
from sweflow.proxy.prompting import PromptBuilding
from sweflow.proxy.recorder import LinearizeConfig, SessionRecord, Turn
from sweflow.proxy.tito import MODES, SuffixRenderer, suffix_template
from sweflow.proxy.tokenize import TokenizerPool
from sweflow.proxy.toolcalls import parse_tool_calls, split_reasoning
from sweflow.schema import default

log = logging.getLogger("sweflow.proxy")


# Limits: a body over `max_body_bytes` -> 413 before it is read; a prompt over `max_prompt_tokens` -> 413
# after bounded work (see sweflow.proxy.tokenize); JSON nested deeper than 64 -> 400.
@dataclass
class ProxyConfig:
    """Server behaviour. Sampling comes from here unless `honor_request_sampling` (RL needs the trainer's)."""

    max_new_tokens: int = default("train.max_response_tokens")
    max_context_tokens: int | None = None
    temperature: float = default("train.sampling.temperature")
    top_p: float = default("train.sampling.top_p")
    top_k: int = default("train.sampling.top_k")
    honor_request_sampling: bool = False
    engine_timeout_s: float = 600.0
    pause_timeout_s: float | None = None
    midlist_system: str = "system"  # role for mid-list system messages; falls back to "user" if refused
    admin_token: str | None = None  # None: a random one is generated (ProxyServer.admin_token)
    max_body_bytes: int = 8 << 20
    max_prompt_tokens: int = 262_144
    tokenizer_copies: int = 4  # concurrent tokenisations; each copy costs the tokenizer's memory
    read_timeout_s: float = 120.0  # a client silent this long mid-request (or idle on keep-alive) is dropped
    stop_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    linearize: LinearizeConfig = field(default_factory=LinearizeConfig)
    max_workers: int = 256
    record_messages: bool = False  # keep each turn's request/response messages (always in pass-through)
    # Pass-through: the most requests one session may send upstream (the key pays for them; None: no cap)
    max_session_requests: int | None = None
    max_session_in_flight: int | None = None  # pass-through: requests of one session upstream at once
    # Token building (sweflow.proxy.tito): "tito" extends each session's exact ids with the appended
    # messages only; "render" re-renders the whole conversation on every call (folded by prefix + drift).
    token_build_mode: str = "tito"
    token_build_model: str = "auto"  # the suffix template's family: auto, qwen3_5, generic


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


# Threading: one thread per connection (ThreadingHTTPServer); the engine call runs in a worker pool with a
# timeout and holds no proxy-wide lock; tokenisation uses a pool of private tokenizer copies. `POST /pause`
# holds new Messages requests before they reach the engine until `POST /resume`; requests already
# generating finish (pause with {"wait_idle": true} returns once none is in flight).
class ProxyServer(PromptBuilding):
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
        # Pass-through (an Upstream engine) needs no tokenizer: the upstream model answers in messages.
        self.passthrough = bool(getattr(engine, "passthrough", False))
        if tokenizer is None and not self.passthrough:
            raise ValueError("a tokenizer is needed unless the engine is a pass-through Upstream")
        self.stop_ids = (
            list(self.config.stop_token_ids or default_stop_ids(tokenizer)) if tokenizer is not None else []
        )
        self.admin_token = self.config.admin_token or secrets.token_urlsafe(32)
        self._sessions: dict[str, SessionRecord] = {}
        self._by_token: dict[bytes, str] = {}  # sha256(session token) -> session id
        self._sessions_lock = threading.Lock()
        self._tokenizers = (
            TokenizerPool(tokenizer, self.config.tokenizer_copies) if tokenizer is not None else None
        )
        if self.config.token_build_mode not in MODES:
            raise ValueError(
                f"token_build_mode must be one of {', '.join(MODES)}, not {self.config.token_build_mode!r}"
            )
        self._suffix: SuffixRenderer | None = None
        if tokenizer is not None and not self.passthrough and self.config.token_build_mode == "tito":
            template = suffix_template(self.config.token_build_model, tokenizer)
            self._suffix = SuffixRenderer(tokenizer, template, self.config.chat_template_kwargs)
        self._stop_texts = [tokenizer.decode([i]) for i in self.stop_ids] if tokenizer is not None else []
        self._midlist_role = self.config.midlist_system
        self._gate = threading.Condition()
        self._paused = False
        self._stopping = False
        self._in_flight = 0
        self.weight_version: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.config.max_workers, thread_name_prefix="engine"
        )
        self._httpd = ProxyHTTPServer((host, port), ProxyHandler)
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

    # ------------------------------------------------------------------ auth
    # Every admin endpoint (`/session/*`, `/trajectory/read`, `/pause`, `/resume`) needs
    # `Authorization: Bearer <admin token>`: `ProxyConfig.admin_token`, or one generated at start
    # (`ProxyServer.admin_token`). Sessions are explicit: the rollout dispatcher calls
    # `POST /session/create {"session_id": ...}` before the agent starts and gets the session's own random
    # `token` back. A Messages request authenticates with `Authorization: Bearer <token>` or
    # `x-api-key: <token>` and reaches that session only; a `/sessions/<id>` path prefix must name the same
    # session (403 otherwise). No or unknown token -> 401 (a session id is not a token), finalized -> 409.
    def is_admin(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.admin_token.encode())

    def session_for_token(self, token: str) -> str | None:
        """The session a bearer token belongs to, or None (looked up by its hash, compared in constant time)."""
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        with self._sessions_lock:
            sid = self._by_token.get(digest)
            rec = self._sessions.get(sid) if sid is not None else None
        if rec is None or not hmac.compare_digest(rec.token.encode(), token.encode()):
            return None
        return sid

    # ------------------------------------------------------------------ sessions
    def create_session(self, session_id: str, metadata: dict | None = None) -> dict:
        """Create a session: {"session_id", "created", "token"}; again for a live one answers its token
        with created False (idempotent). 409 if it was finalized."""
        check_session_id(session_id)
        with self._sessions_lock:
            existing = self._sessions.get(session_id)
            if existing is not None:
                if existing.finalized:
                    raise HttpError(409, "invalid_request_error", f"session {session_id!r} is finalized")
                return {"session_id": session_id, "created": False, "token": existing.token}
            rec = SessionRecord(session_id, metadata, token=secrets.token_urlsafe(32))
            self._sessions[session_id] = rec
            self._by_token[hashlib.sha256(rec.token.encode()).digest()] = session_id
            return {"session_id": session_id, "created": True, "token": rec.token}

    def session(self, session_id: str, *, for_messages: bool = False) -> SessionRecord:
        with self._sessions_lock:
            rec = self._sessions.get(session_id)
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
            rec = self._sessions.pop(session_id, None)
            if rec is not None:
                self._by_token.pop(hashlib.sha256(rec.token.encode()).digest(), None)

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
    def count_tokens(self, body: Any, headers: Any = None) -> dict:
        req = an.parse_request(body, require_max_tokens=False)
        if self.passthrough:
            return self.engine.count_tokens(body, headers)
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

    def _forward(self, session_id: str, body: dict, headers: Any) -> dict:
        """Pass-through: the upstream's answer, under the same pause gate and timeout as an engine call."""
        self._enter_gate()
        try:
            future = self._pool.submit(self.engine.messages, body, session_id=session_id, headers=headers)
        except RuntimeError as exc:
            self._leave_gate()
            raise HttpError(503, "overloaded_error", "proxy is stopping") from exc
        future.add_done_callback(self._leave_gate)
        try:
            return future.result(timeout=self.config.engine_timeout_s)
        except concurrent.futures.TimeoutError as exc:
            raise HttpError(504, "timeout_error", "upstream timed out") from exc

    def _handle_passthrough(
        self, session_id: str, rec: SessionRecord, req: an.MessagesRequest, body: dict, headers: Any
    ) -> tuple[dict, SessionRecord, int]:
        received = time.time()
        cap = self.config.max_session_requests
        index = rec.next_index()  # reserved before forwarding: failed and timed-out requests count too
        if cap is not None and index >= cap:
            raise HttpError(429, "rate_limit_error", f"this session has used its {cap} upstream requests")
        body = dict(body)
        body["max_tokens"] = min(
            req.max_tokens, self.config.max_new_tokens
        )  # the proxy's cap, not the agent's
        if not rec.enter(self.config.max_session_in_flight):
            raise HttpError(429, "rate_limit_error", "too many requests of this session in flight")
        try:
            message = self._forward(session_id, body, headers)
        finally:
            rec.leave()
        blocks = [b for b in message["content"] if isinstance(b, dict)]
        rec.add(
            Turn(
                index=index,
                prompt_ids=[],
                output_ids=[],
                logprobs=[],
                finish_reason=str(message.get("stop_reason") or ""),
                timings={"received": received, "total_s": time.time() - received},
                stop_reason=str(message.get("stop_reason") or ""),
                model=str(message.get("model") or req.model),
                weight_version=None,
                tool_calls=[
                    {"name": b.get("name", ""), "input": b.get("input") or {}}
                    for b in blocks
                    if b.get("type") == "tool_use"
                ],
                request=_request_record(req),
                response={k: message.get(k) for k in ("id", "model", "content", "stop_reason", "usage")},
            )
        )
        return message, rec, index

    def handle_messages(
        self, session_id: str, body: Any, headers: Any = None
    ) -> tuple[dict, SessionRecord, int]:
        """Run one Messages request for a session; return (response message, session, turn index)."""
        received = time.time()
        rec = self.session(session_id, for_messages=True)
        req = an.parse_request(body)
        if self.passthrough:
            return self._handle_passthrough(session_id, rec, req, body, headers)
        prompt_ids, plan, chat, tools = self.build_prompt(req, rec)
        sampling = self._sampling(req, len(prompt_ids))
        sampling.request_id = session_id
        rendered = time.time()
        index = rec.next_index()
        result = self._generate(prompt_ids, sampling)
        generated = time.time()
        reasoning, answer = split_reasoning(self.decode(result.output_ids), self._opens_thinking(prompt_ids))
        parsed = parse_tool_calls(answer, req.tools)
        blocks = an.content_blocks(parsed.text, parsed.tool_calls, reasoning) or [
            {"type": "text", "text": ""}
        ]
        rec.remember_tool_inputs(blocks)
        lineage, build, commit = None, "render", None
        if plan is not None:
            output = list(result.output_ids)
            lineage, build, version = rec.lineages.commit(
                plan,
                chat=chat,
                tools=tools,
                answer=an.to_chat_messages(None, [{"role": "assistant", "content": blocks}])[0],
                prompt_ids=prompt_ids,
                output_ids=output,
                ended_with_stop=bool(output) and output[-1] in self.stop_ids,
            )
            commit = (lineage, version)
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
            tool_calls=[
                {"name": b.get("name", ""), "input": b.get("input") or {}}
                for b in blocks
                if b.get("type") == "tool_use"
            ],
            lineage=lineage,
            token_build=build,
        )
        if self.config.record_messages:
            turn.request = _request_record(req)
            turn.response = {k: message.get(k) for k in ("id", "model", "content", "stop_reason", "usage")}
        rec.add(turn, commit)
        return message, rec, index


def _request_record(req: an.MessagesRequest) -> dict[str, Any]:
    """What a turn keeps of its request: the model, the exact system prompt, tools and messages."""
    return {"model": req.model, "system": req.system, "tools": req.tools, "messages": req.messages}
