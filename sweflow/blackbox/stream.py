"""Claude Code's stream-json output: one line -> one event -> the outputs a /messages answer lists.

Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OUTPUT_TEXT_CHARS = 16_000  # per tool_result / text in the /messages answer; full events stay in the session


def _clip(text: str, limit: int = OUTPUT_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} chars cut]"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else json.dumps(content)


def event_outputs(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The outputs one stream-json event contributes: assistant text/thinking/tool_use, user tool_result."""
    kind = event.get("type")
    message = event.get("message") if isinstance(event.get("message"), dict) else {}
    content = message.get("content")
    if kind not in ("assistant", "user") or not isinstance(content, list):
        return []
    out: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        btype = block.get("type")
        if kind == "assistant" and btype == "text":
            out.append({"type": "text", "text": _clip(block.get("text", ""))})
        elif kind == "assistant" and btype == "thinking":
            out.append({"type": "thinking", "thinking": _clip(block.get("thinking", ""))})
        elif kind == "assistant" and btype == "tool_use":
            out.append(
                {
                    "type": "tool_use",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "input": block.get("input"),
                }
            )
        elif kind == "user" and btype == "tool_result":
            out.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.get("tool_use_id"),
                    "content": _clip(_result_text(block.get("content"))),
                    "is_error": bool(block.get("is_error", False)),
                }
            )
    return out


def parse_line(line: str) -> dict[str, Any] | None:
    """One stdout line -> an event dict; non-JSON output becomes {"type": "raw", "line": ...}; blank -> None."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return {"type": "raw", "line": _clip(line, 4_000)}
    if not isinstance(event, dict):
        return {"type": "raw", "line": _clip(line, 4_000)}
    return event


@dataclass
class TurnOutcome:
    """One agent turn: how the process ended, the parsed result event, outputs, stderr tail."""

    reason: str  # exited | timeout | aborted
    returncode: int | None
    duration: float
    outputs: list[dict[str, Any]]
    result_event: dict[str, Any] | None
    events_count: int
    stderr_tail: str
    claude_session: str

    @property
    def crashed(self) -> bool:
        """Exited without a final result event: the CLI failed (bad flags, auth, crash)."""
        return self.reason == "exited" and self.result_event is None

    def summary(self) -> dict[str, Any]:
        res = self.result_event or {}
        usage = res.get("usage") if isinstance(res.get("usage"), dict) else {}
        return {
            "outputs": self.outputs,
            "result": res.get("result") if isinstance(res.get("result"), str) else "",
            "usage": {
                k: v for k, v in usage.items() if isinstance(v, int | float) and not isinstance(v, bool)
            },
            "total_cost_usd": res.get("total_cost_usd"),
            "num_turns": res.get("num_turns", 0),
            "stop_reason": res.get("stop_reason"),
            "subtype": res.get("subtype"),
            "terminal_reason": res.get("terminal_reason"),
            "api_error": res.get("api_error"),  # e.g. "connection_failed" when the router is unreachable
            "errors": [_clip(str(e), 2_000) for e in res.get("errors") or []][:20],
            "permission_denials": len(res.get("permission_denials") or []),
            "duration": round(self.duration, 3),
            "is_error": bool(res.get("is_error", self.result_event is None)),
            "events_count": self.events_count,
            "returncode": self.returncode,
            "claude_session_id": self.claude_session,
        }
