"""A scripted stand-in for the Anthropic Messages API, for tests (a test fake, not part of the library).

The stub answers `POST /v1/messages` (SSE streaming or plain JSON) and `POST /v1/messages/count_tokens`
from a *policy*: a list of assistant turns, each a list of content blocks (text / tool_use). Every agent
request (one that carries `tools`) takes the next turn; side requests without tools get a short text reply
and do not consume the script. Once the script is exhausted the stub ends the conversation with a text
turn. Every request is recorded (path, bearer token, body) so tests can check what the agent sent.

Standard library only, so it can also run inside a sandbox next to the blackbox server.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EXHAUSTED_TEXT = "Script exhausted; stopping."
SIDE_REPLY_TEXT = "ok"


def text(body: str) -> dict[str, Any]:
    """A text content block for a scripted turn."""
    return {"type": "text", "text": body}


def tool_use(name: str, input: dict[str, Any], id: str | None = None) -> dict[str, Any]:  # noqa: A002
    """A tool_use content block; `id` defaults to a unique id assigned by the stub."""
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": dict(input)}
    if id is not None:
        block["id"] = id
    return block


@dataclass
class Turn:
    """One scripted assistant message; stop_reason defaults to tool_use when it holds a tool call."""

    blocks: list[dict[str, Any]]
    stop_reason: str | None = None

    def resolved_stop_reason(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        return "tool_use" if any(b.get("type") == "tool_use" for b in self.blocks) else "end_turn"


def turn(*blocks: dict[str, Any], stop_reason: str | None = None) -> Turn:
    return Turn(list(blocks), stop_reason)


def load_policy(data: Any) -> list[Turn]:
    """Build a policy from plain data: a list of turns, each a list of blocks or {blocks, stop_reason}."""
    if not isinstance(data, list):
        raise ValueError("policy: expected a list of turns")
    turns = []
    for i, item in enumerate(data):
        if isinstance(item, Turn):
            turns.append(item)
        elif isinstance(item, list):
            turns.append(Turn(list(item)))
        elif isinstance(item, dict) and isinstance(item.get("blocks"), list):
            turns.append(Turn(list(item["blocks"]), item.get("stop_reason")))
        else:
            raise ValueError(f"policy: turn {i}: expected a list of blocks or {{blocks, stop_reason}}")
        for block in turns[-1].blocks:
            if block.get("type") not in ("text", "tool_use"):
                raise ValueError(f"policy: turn {i}: unsupported block type {block.get('type')!r}")
    return turns


@dataclass
class RecordedRequest:
    """What the stub received: the path (with query), the bearer token, whether x-api-key was sent, the body."""

    path: str
    bearer: str | None
    has_api_key: bool
    body: dict[str, Any]
    turn_index: int | None = None  # the scripted turn served, None for side requests / count_tokens

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool_result block in the request's messages, in order."""
        out = []
        for msg in self.body.get("messages", []):
            content = msg.get("content")
            if isinstance(content, list):
                out.extend(b for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
        return out

    def tool_names(self) -> list[str]:
        return [t.get("name", "") for t in self.body.get("tools", []) or []]


@dataclass
class _State:
    policy: list[Turn]
    model: str
    requests: list[RecordedRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    next_turn: int = 0
    tool_counter: int = 0
    input_tokens: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _estimate_tokens(obj: Any) -> int:
    return max(1, len(json.dumps(obj, sort_keys=True)) // 4)


def _check_tool_input(block: dict[str, Any], tools: list[dict[str, Any]]) -> list[str]:
    """Light schema check of a scripted tool call against the tools the client declared."""
    schema = next((t.get("input_schema") for t in tools if t.get("name") == block["name"]), None)
    if schema is None:
        return [f"tool {block['name']!r} is not among the request's tools"]
    problems = []
    props = schema.get("properties", {}) or {}
    for key in schema.get("required", []) or []:
        if key not in block["input"]:
            problems.append(f"tool {block['name']!r}: missing required input {key!r}")
    if schema.get("additionalProperties") is False:
        for key in block["input"]:
            if key not in props:
                problems.append(f"tool {block['name']!r}: unknown input {key!r}")
    return problems


class AnthropicStub:
    """A scripted Messages API server on 127.0.0.1; use as a context manager or start()/stop()."""

    def __init__(
        self,
        policy: list[Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "stub-model",
        input_tokens: int | None = None,
    ):
        """``input_tokens``: the usage every reply reports (default: an estimate from the messages)."""
        self._state = _State(policy=load_policy(policy), model=model, input_tokens=input_tokens)
        ids = [
            b["id"] for t in self._state.policy for b in t.blocks if b.get("type") == "tool_use" and "id" in b
        ]
        if len(ids) != len(set(ids)):
            raise ValueError("policy: tool_use ids must be unique")
        self._server = ThreadingHTTPServer((host, port), _make_handler(self._state))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    @property
    def agent_requests(self) -> list[RecordedRequest]:
        """The requests that consumed (or tried to consume) a scripted turn."""
        return [r for r in self.requests if r.turn_index is not None]

    @property
    def errors(self) -> list[str]:
        """Problems seen while serving (unknown tool, bad tool input, script exhausted); empty when all went well."""
        with self._state.lock:
            return list(self._state.errors)

    @property
    def turns_served(self) -> int:
        with self._state.lock:
            return self._state.next_turn

    def start(self) -> AnthropicStub:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="anthropic-stub",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> AnthropicStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _next_message(state: _State, body: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Pick the reply for one request and return (message, turn index or None for side requests)."""
    tools = body.get("tools") or []
    with state.lock:
        if not tools:
            blocks, stop, index = [text(SIDE_REPLY_TEXT)], "end_turn", None
        elif state.next_turn < len(state.policy):
            index = state.next_turn
            scripted = state.policy[index]
            state.next_turn += 1
            blocks, stop = [], scripted.resolved_stop_reason()
            for block in scripted.blocks:
                block = json.loads(json.dumps(block))
                if block["type"] == "tool_use":
                    state.tool_counter += 1
                    block.setdefault("id", f"toolu_stub_{state.tool_counter:04d}")
                    state.errors.extend(_check_tool_input(block, tools))
                blocks.append(block)
        else:
            index = state.next_turn
            state.errors.append(f"script exhausted: request {len(state.requests)} asked for turn {index}")
            blocks, stop = [text(EXHAUSTED_TEXT)], "end_turn"
    message = {
        "id": f"msg_stub_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or state.model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": state.input_tokens or _estimate_tokens(body.get("messages", [])),
            "output_tokens": _estimate_tokens(blocks),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    return message, index


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _chunks(s: str, size: int = 24) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


def stream_events(message: dict[str, Any]) -> bytes:
    """Render a complete message as the Messages API SSE event sequence."""
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = dict(message["usage"], output_tokens=1)
    out = [_sse("message_start", {"type": "message_start", "message": start}), _sse("ping", {"type": "ping"})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"])]
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": c} for c in _chunks(json.dumps(block["input"]))
            ]
        out.append(
            _sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": first})
        )
        for d in deltas:
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    out.append(_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _make_handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: tests read state.requests instead

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("request-id", f"req_stub_{uuid.uuid4().hex[:16]}")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, kind: str, message: str) -> None:
            body = {"type": "error", "error": {"type": kind, "message": message}}
            self._send(status, json.dumps(body).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?")[0] in ("/", "/health"):
                self._send(200, b'{"ok": true}', "application/json")
            else:
                self._error(404, "not_found_error", f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            route = self.path.split("?")[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._error(400, "invalid_request_error", "body is not JSON")
                return
            auth = self.headers.get("Authorization") or ""
            bearer = auth[7:] if auth.lower().startswith("bearer ") else None
            record = RecordedRequest(self.path, bearer, bool(self.headers.get("x-api-key")), body)
            if route == "/v1/messages/count_tokens":
                with state.lock:
                    state.requests.append(record)
                reply = {"input_tokens": _estimate_tokens(body.get("messages", []))}
                self._send(200, json.dumps(reply).encode(), "application/json")
                return
            if route != "/v1/messages":
                self._error(404, "not_found_error", f"no route {self.path}")
                return
            message, record.turn_index = _next_message(state, body)
            with state.lock:
                state.requests.append(record)
            if body.get("stream"):
                self._send(200, stream_events(message), "text/event-stream")
            else:
                self._send(200, json.dumps(message).encode(), "application/json")

    return Handler


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.fakes.anthropic_stub --policy policy.json [--port N]`: serve a policy until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="JSON file: a list of turns")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with open(args.policy, encoding="utf-8") as fh:
        policy = json.load(fh)
    stub = AnthropicStub(policy, host=args.host, port=args.port)
    print(stub.url, flush=True)
    try:
        stub._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stub._server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
