"""The one in-memory form every trajectory reader produces and every writer consumes.

`Trajectory.messages` are OpenAI-style chat messages after the system prompt (kept apart, byte for byte,
in `system`); `tools` are OpenAI function schemas; `text_messages` is the SWE-smith text form when the
source defines it itself. The shapes are written above `Trajectory`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


# `Trajectory.messages` are OpenAI-style chat messages after the system prompt (the system prompt is kept
# apart, byte for byte, in `system`):
#
# - ``{"role": "user", "content": str}``
# - ``{"role": "assistant", "content": str, "tool_calls": [{"id": str, "type": "function", "function":
#   {"name": str, "arguments": <JSON string>}}]}`` (``tool_calls`` absent when there is none)
# - ``{"role": "tool", "tool_call_id": str, "name": str, "content": str}``
#
# `tools` are OpenAI function schemas: ``{"type": "function", "function": {"name", "description",
# "parameters"}}``. `text_messages` is the SWE-smith text form when the source defines it itself (a SWE-agent
# history already holds the text the model saw); None means "render it from `messages`".
@dataclass
class Trajectory:
    """One agent run on one task, in the common form (see the comment above)."""

    id: str
    instance_id: str
    source: str  # "claude_code" | "swe_agent"
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    text_messages: list[dict[str, Any]] | None = None
    patch: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
