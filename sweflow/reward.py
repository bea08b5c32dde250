"""Turn the evaluator's output (its ``SWEFLOW_REWARD_JSON=`` marker line) into a reward.

Only lines that START with the marker count (a marker text quoted inside a log tail does not), and the
last such line wins. Reward is 1.0 only for ``resolved: true`` with no failure reason, else 0.0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sweflow.harness.driver import DEFAULT_REWARD_MARKER

MISSING_MARKER = "missing_reward_marker"
MALFORMED_MARKER = "malformed_reward_marker"
_RAW_LIMIT = 500


@dataclass(frozen=True)
class RewardResult:
    """A scalar reward with its verdict; ``details`` is the marker payload (or an error description)."""

    reward: float
    resolved: bool
    failure_reason: str | None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "resolved": self.resolved,
            "failure_reason": self.failure_reason,
            "details": self.details,
        }


def parse_marker(output: str, marker: str = DEFAULT_REWARD_MARKER) -> dict[str, Any] | None:
    """The payload of the last marker line in ``output``; None when there is none.

    A malformed payload (not a JSON object, or ``resolved`` not a boolean) yields
    ``{"resolved": False, "failure_reason": "malformed_reward_marker", "raw": <truncated line>}``.
    """
    last = None
    for line in (output or "").splitlines():
        stripped = line.strip()
        if stripped.startswith(marker):
            last = stripped[len(marker) :]
    if last is None:
        return None
    try:
        payload = json.loads(last)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or not isinstance(payload.get("resolved"), bool):
        return {"resolved": False, "failure_reason": MALFORMED_MARKER, "raw": last[:_RAW_LIMIT]}
    return payload


def reward_from_payload(payload: dict[str, Any] | None) -> RewardResult:
    """A RewardResult from a parsed marker payload (None -> missing marker)."""
    if payload is None:
        return RewardResult(0.0, False, MISSING_MARKER, {})
    resolved = payload.get("resolved") is True and payload.get("failure_reason") is None
    reason = None if resolved else (payload.get("failure_reason") or "not_resolved")
    return RewardResult(1.0 if resolved else 0.0, resolved, reason, dict(payload))


def reward_from_output(output: str, marker: str = DEFAULT_REWARD_MARKER) -> RewardResult:
    """Reward for the evaluator command's stdout: 1.0 only if its marker says resolved."""
    return reward_from_payload(parse_marker(output, marker))
