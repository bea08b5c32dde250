"""Anthropic Messages API <-> chat-template messages, content blocks and SSE events.

Pure data in, data out: the server validates a request with `parse_request`, renders
`to_chat_messages`/`to_chat_tools` through the tokenizer's chat template, and turns the decoded model
output back into a Messages response with `build_message` (JSON) or `sse_events` (stream).
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from sweflow.errors import ProxyError
from sweflow.proxy.toolcalls import ToolCall

_ALPHABET = string.ascii_letters + string.digits
TEXT_CHUNK_CHARS = 64  # size of text_delta pieces in a stream; purely cosmetic for the client


# Validation failures raise `RequestError`, which the server maps to a 400 `invalid_request_error`.
class RequestError(ProxyError):
    """The request body is not a valid Messages request (HTTP 400)."""


@dataclass
class MessagesRequest:
    """The validated parts of a Messages request the proxy uses."""

    model: str
    max_tokens: int
    messages: list[dict]
    system: str | list[dict] | None = None
    tools: list[dict] = field(default_factory=list)
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] = field(default_factory=list)


def _bad(problem: str, fld: str | None = None) -> RequestError:
    return RequestError(problem, field=fld)


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad("content block must be an object with a string 'type'", f"{where}[{j}]")
        kind = block["type"]
        if kind == "text" and not isinstance(block.get("text"), str):
            raise _bad("text block needs a string 'text'", f"{where}[{j}].text")
        if kind == "tool_use" and (not isinstance(block.get("name"), str) or "id" not in block):
            raise _bad("tool_use block needs 'id' and 'name'", f"{where}[{j}]")
        if kind == "tool_result" and "tool_use_id" not in block:
            raise _bad("tool_result block needs 'tool_use_id'", f"{where}[{j}]")


def parse_request(body: Any, *, require_max_tokens: bool = True) -> MessagesRequest:
    """Validate a decoded JSON body; raise RequestError naming the offending field."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _bad("message must be an object", f"messages[{i}]")
        if msg.get("role") not in ("user", "assistant", "system"):
            raise _bad(
                f"role must be 'user', 'assistant' or 'system', got {msg.get('role')!r}",
                f"messages[{i}].role",
            )
        if "content" not in msg:
            raise _bad("message needs 'content'", f"messages[{i}].content")
        _check_content(msg["content"], f"messages[{i}].content")
    max_tokens = body.get("max_tokens")
    if require_max_tokens and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _bad("max_tokens must be a positive integer", "max_tokens")
    system = body.get("system")
    if system is not None:
        _check_content(system, "system")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or any(
        not isinstance(t, dict) or not isinstance(t.get("name"), str) for t in tools
    ):
        raise _bad("tools must be a list of objects with a string 'name'", "tools")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or any(not isinstance(s, str) for s in stops):
        raise _bad("stop_sequences must be a list of strings", "stop_sequences")
    for key in ("temperature", "top_p"):
        if body.get(key) is not None and not isinstance(body[key], int | float):
            raise _bad(f"{key} must be a number", key)
    return MessagesRequest(
        model=str(body.get("model") or ""),
        max_tokens=int(max_tokens or 0),
        messages=messages,
        system=system,
        tools=tools,
        stream=bool(body.get("stream", False)),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        top_k=body.get("top_k"),
        stop_sequences=stops,
    )


def block_text(content: Any) -> str:
    """Flatten tool_result / system content (string or blocks) to text; images become a placeholder."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") in ("image", "document"):
            parts.append(f"[{block['type']} omitted]")
    return "\n".join(parts)


def system_text(system: str | list[dict] | None) -> str:
    """The system prompt as one string (Claude Code sends several text blocks)."""
    return block_text(system)


def to_chat_messages(
    system: str | list[dict] | None, messages: list[dict], *, midlist_system: str = "system"
) -> list[dict]:
    """Anthropic system + messages -> chat-template messages.

    tool_use -> assistant `tool_calls` (arguments as a dict), tool_result -> role "tool" messages (in block
    order, before any text of the same user turn that follows them), thinking -> `reasoning_content`.
    Mid-list role "system" messages keep role `midlist_system` ("system", or "user" for templates that
    only accept a leading system message).
    """
    out: list[dict] = []
    sys_text = system_text(system)
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    tool_names: dict[str, str] = {}
    for msg in messages:
        role, content = msg["role"], msg["content"]
        if role == "system" and out:
            role = midlist_system
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if role == "assistant":
            texts, reasoning, calls = [], [], []
            for block in content:
                kind = block["type"]
                if kind == "text":
                    texts.append(block["text"])
                elif kind in ("thinking", "redacted_thinking"):
                    reasoning.append(block.get("thinking", ""))
                elif kind in ("tool_use", "server_tool_use"):
                    tool_names[str(block["id"])] = block["name"]
                    calls.append(
                        {
                            "id": str(block["id"]),
                            "type": "function",
                            "function": {"name": block["name"], "arguments": block.get("input") or {}},
                        }
                    )
            chat: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if reasoning:
                chat["reasoning_content"] = "\n".join(reasoning)
            if calls:
                chat["tool_calls"] = calls
            out.append(chat)
            continue
        pending: list[str] = []

        def flush(role: str = role, pending: list[str] = pending) -> None:
            if pending:
                out.append({"role": role, "content": "\n".join(pending)})
                pending.clear()

        for block in content:
            kind = block["type"]
            if kind == "tool_result":
                flush()
                text = block_text(block.get("content"))
                if block.get("is_error") and not text.startswith("Error"):
                    text = f"Error: {text}"
                tool_id = str(block["tool_use_id"])
                out.append(
                    {
                        "role": "tool",
                        "content": text,
                        "tool_call_id": tool_id,
                        "name": tool_names.get(tool_id, ""),
                    }
                )
            elif kind == "text":
                pending.append(block["text"])
            elif kind in ("image", "document"):
                pending.append(f"[{kind} omitted]")
        flush()
    return out


def to_chat_tools(tools: list[dict]) -> list[dict]:
    """Anthropic tool definitions -> OpenAI-style function tools for `apply_chat_template(tools=...)`.

    Server tools without an `input_schema` (web search etc.) are dropped: the model cannot call them.
    """
    out = []
    for tool in tools:
        if "input_schema" not in tool:
            continue
        out.append(
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool["input_schema"],
                },
            }
        )
    return out


def new_id(prefix: str) -> str:
    """Random Anthropic-looking id, e.g. toolu_01..., msg_01... (24 base62 characters)."""
    return prefix + "01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))


def stop_reason_for(finish_reason: str, has_tool_calls: bool, stop_sequence: str | None = None) -> str:
    """Engine finish reason -> Anthropic stop_reason."""
    if has_tool_calls and finish_reason != "length":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def content_blocks(text: str, tool_calls: list[ToolCall], reasoning: str = "") -> list[dict]:
    """A thinking block (when there is reasoning), text (when non-empty), then one tool_use block per
    call, each with a fresh unique id. The thinking block's signature is an opaque id: the proxy never
    reads it back (a token-in/token-out call reuses the model's own ids, whatever the agent echoes)."""
    blocks: list[dict] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": new_id("sig_")})
    if text:
        blocks.append({"type": "text", "text": text})
    for call in tool_calls:
        blocks.append(
            {"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": call.arguments}
        )
    return blocks


def build_message(
    *,
    model: str,
    blocks: list[dict],
    stop_reason: str,
    input_tokens: int,
    output_tokens: int,
    message_id: str | None = None,
    stop_sequence: str | None = None,
) -> dict:
    """A complete (non-streamed) Messages response object."""
    return {
        "id": message_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(input_tokens, output_tokens),
    }


def _usage(input_tokens: int, output_tokens: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def sse_events(message: dict) -> list[tuple[str, dict]]:
    """The event sequence streaming `message` would produce, as (event name, data) pairs.

    message_start (empty content) -> per block: content_block_start, deltas (text_delta pieces or one
    input_json_delta), content_block_stop -> message_delta (stop_reason, usage) -> message_stop.
    """
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = _usage(message["usage"]["input_tokens"], 1)
    events: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            head = {"type": "text", "text": ""}
            text = block["text"]
            deltas = [
                {"type": "text_delta", "text": text[i : i + TEXT_CHUNK_CHARS]}
                for i in range(0, len(text), TEXT_CHUNK_CHARS)
            ]
        elif block["type"] == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            ]
        elif block["type"] == "thinking":  # a pass-through upstream's reasoning, with its signature
            head = {"type": "thinking", "thinking": ""}
            deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # redacted_thinking and other whole blocks arrive complete in their start event
            head, deltas = dict(block), []
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": head})
        )
        for delta in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def format_sse(event: str, data: dict) -> bytes:
    """One SSE frame."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def error_body(error_type: str, message: str) -> dict:
    """Anthropic-style error object, e.g. error_body("invalid_request_error", "...")."""
    return {"type": "error", "error": {"type": error_type, "message": message}}
