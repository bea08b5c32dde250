"""Claude Code transcripts (the turns the proxy records) -> `Trajectory`, and the tool-call chat rows.

`read_claude_code` takes the main thread (the turns whose request lists tools), checks its last turn against
the earlier ones (or refuses the transcript) and maps the Anthropic messages to OpenAI chat messages
(`openai_messages`); `tool_call_row` writes a trajectory as a tool-call chat row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DatasetError
from ..proxy.anthropic import block_text
from .types import Trajectory


# Anthropic -> OpenAI mapping: text blocks join into `content`; `tool_use` blocks become `tool_calls` (the
# block id, the name, the input as a JSON string); `tool_result` blocks become `tool` messages (in order,
# before any text of the same user message; `is_error` results keep their text and are counted in meta);
# `thinking` blocks are left out of the chat form and counted. The system prompt is the system blocks'
# texts joined by newlines (what the proxy renders for its own engines), and the blocks are kept in meta.
def openai_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Anthropic tool definitions -> OpenAI function schemas (server tools without a schema left out)."""
    out = []
    for t in tools or []:
        if "input_schema" not in t:
            continue
        out.append(
            {
                "type": "function",
                "function": {
                    "name": str(t["name"]),
                    "description": str(t.get("description") or ""),
                    "parameters": t["input_schema"],
                },
            }
        )
    return out


def openai_messages(
    messages: Sequence[Mapping[str, Any]], counts: dict[str, int] | None = None
) -> list[dict]:
    """Anthropic messages -> OpenAI chat messages (see the mapping comment above `openai_tools`)."""
    counts = counts if counts is not None else {}
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for msg in messages:
        role, content = msg.get("role"), msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if role == "assistant":
            text, calls = [], []
            for b in blocks:
                kind = b.get("type")
                if kind == "text":
                    text.append(str(b.get("text", "")))
                elif kind == "tool_use":
                    names[str(b["id"])] = str(b.get("name", ""))
                    args = json.dumps(b.get("input") or {}, ensure_ascii=False)
                    calls.append({"id": str(b["id"]), "type": "function",
                                  "function": {"name": str(b.get("name", "")), "arguments": args}})  # fmt: skip
                elif kind in ("thinking", "redacted_thinking"):
                    counts["thinking_blocks"] = counts.get("thinking_blocks", 0) + 1
            entry: dict[str, Any] = {"role": "assistant", "content": "\n".join(t for t in text if t)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        texts = []
        for b in blocks:
            if b.get("type") == "tool_result":
                tid = str(b.get("tool_use_id"))
                if b.get("is_error"):
                    counts["tool_errors"] = counts.get("tool_errors", 0) + 1
                out.append({"role": "tool", "tool_call_id": tid, "name": names.get(tid, ""),
                            "content": block_text(b.get("content"))})  # fmt: skip
            elif b.get("type") == "text":
                texts.append(str(b.get("text", "")))
        if texts:
            out.append({"role": "system" if role == "system" else "user", "content": "\n".join(texts)})
    return out


def _main_turns(turns: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    main = [
        t for t in turns
        if not t.get("aborted") and isinstance(t.get("request"), Mapping) and t["request"].get("tools")
        and isinstance(t.get("response"), Mapping)
    ]  # fmt: skip
    return sorted(main, key=lambda t: int(t.get("index") or 0))


# A recorded turn holds the Messages request Claude Code sent (model, system, tools, messages) and the
# response it got. Claude Code also makes side requests without tools (titles, summaries); the conversation
# that solved the task is the main thread: the turns whose request lists tools. Each main-thread request
# repeats the whole conversation so far, so the last main turn's request plus its response is the whole run.
# That last turn is checked against the earlier ones: every earlier main response must appear, in order, as
# an assistant message of it (a compacted or forked context would not), and every assistant message of it
# must be a recorded response (the request is written on the sandbox side, so an unaccounted one is forged),
# or the transcript is refused.
def read_claude_code(record: Mapping[str, Any], *, where: str = "predictions") -> Trajectory:
    """A prediction record (``sweflow.trajectories.collect.prediction_record``) -> Trajectory."""
    rid = str(record.get("id") or "")
    main = _main_turns(record.get("turns") or [])
    if not main:
        raise DatasetError("the transcript has no main-thread turn (no request with tools)", file=where,
                           row=rid, field="turns")  # fmt: skip
    last = main[-1]
    request, response = last["request"], last["response"]
    conversation = list(request.get("messages") or []) + [
        {"role": "assistant", "content": list(response.get("content") or [])}
    ]
    # Every main response (the last one included) is one of the conversation's assistant messages, in
    # order; the recorded response replaces the re-sent copy (Claude Code re-sends some tool inputs with
    # defaults added, e.g. Edit's replace_all): the training target is what the model wrote.
    pos = 0
    matched: set[int] = set()
    original = [_normal(m) for m in conversation]
    for turn in main:
        content = list(turn["response"].get("content") or [])
        key = _answer_key(content)
        while pos < len(conversation) and (
            conversation[pos].get("role") != "assistant" or _answer_key(conversation[pos]["content"]) != key
        ):
            pos += 1
        if pos == len(conversation):
            raise DatasetError("the last request does not contain every earlier answer (compacted or forked "
                               "context)", file=where, row=rid, field="turns")  # fmt: skip
        # An answer counts only where it was given: its own request is exactly the conversation before it,
        # with the same system prompt and tools (else a real answer to another request could be spliced in).
        asked = turn["request"]
        if (
            [_normal(m) for m in asked.get("messages") or []] != original[:pos]
            or _strip_cache(asked.get("system")) != _strip_cache(request.get("system"))
            or _strip_cache(asked.get("tools")) != _strip_cache(request.get("tools"))
        ):
            raise DatasetError(f"answer {turn.get('index')} was given to a request that is not the conversation "
                               "before it", file=where, row=rid, field="turns")  # fmt: skip
        conversation[pos] = {"role": "assistant", "content": content}
        matched.add(pos)
        pos += 1
    # The request comes from the sandbox side: an assistant message there that no recorded answer accounts
    # for was never written by the model (a forged history), and training on it would teach it.
    forged = [i for i, m in enumerate(conversation) if m.get("role") == "assistant" and i not in matched]
    if forged:
        raise DatasetError(f"{len(forged)} assistant message(s) of the conversation match no recorded answer",
                           file=where, row=rid, field="turns")  # fmt: skip
    counts: dict[str, int] = {}
    messages = openai_messages(conversation, counts)
    system = request.get("system")
    return Trajectory(
        id=rid,
        instance_id=str(record.get("instance_id") or ""),
        source="claude_code",
        system=block_text(system),
        messages=messages,
        tools=openai_tools(request.get("tools")),
        patch=record.get("patch"),
        meta={
            "model": str(response.get("model") or request.get("model") or ""),
            "session_id": record.get("session_id"),
            "attempt": record.get("attempt"),
            "main_turns": len(main),
            "side_turns": len(record.get("turns") or []) - len(main),
            "system_blocks": system if isinstance(system, list) else None,
            **counts,
        },
    )


def _strip_cache(value: Any) -> Any:
    """`value` without cache_control marks (Claude Code moves its cache breakpoints from request to request)."""
    if isinstance(value, dict):
        return {k: _strip_cache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache(v) for v in value]
    return value


def _normal(message: Mapping[str, Any]) -> tuple:
    """A message as compared across requests: assistant answers by their key (tool inputs are re-sent with
    defaults added), everything else exactly, cache marks aside."""
    if message.get("role") == "assistant":
        return ("assistant", _answer_key(message.get("content")))
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return (message.get("role"), json.dumps(_strip_cache(blocks), sort_keys=True))


def _answer_key(content: Any) -> tuple:
    """What identifies an answer across re-sends: its tool_use ids, else its text."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    ids = tuple(str(b.get("id")) for b in blocks if b.get("type") == "tool_use")
    if ids:
        return ("tools", *ids)
    return ("text", "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text").strip())


def tool_call_row(traj: Trajectory) -> dict[str, Any]:
    """The tool-call chat row: {"id", "instance_id", "source", "messages" (system first), "tools", "meta"}."""
    return {
        "id": traj.id,
        "instance_id": traj.instance_id,
        "source": traj.source,
        "messages": [{"role": "system", "content": traj.system}, *traj.messages],
        "tools": traj.tools,
        "meta": {k: v for k, v in traj.meta.items() if k != "system_blocks"},
    }
