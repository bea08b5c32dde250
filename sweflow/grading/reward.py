"""Turn the evaluator's output (its ``SWEFLOW_REWARD_JSON=`` marker line) into a reward.

Only lines that START with the marker count (a marker text quoted inside a log tail does not), and the
last such line wins. Reward is 1.0 only for ``resolved: true`` with no failure reason, else 0.0. The
grading rules behind ``resolved`` are in the comment after the imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from sweflow.grading.reasons import RUNNER_TAMPERED
from sweflow.harness.driver import DEFAULT_REWARD_MARKER

# The grading rules behind ``resolved`` (``sweflow.harness.driver.grade``), decided against upstream SWE-bench
# and checked on its own test data and SWE-smith's logs (``tests/unit/test_upstream_corpus.py``):
#
# - A test passes iff its parsed status is PASSED or XFAIL; an absent test fails. Resolved iff every
#   FAIL_TO_PASS test passes and every PASS_TO_PASS test passes or is SKIPPED (swebench 5.x: a skip is not a
#   regression). A SKIPPED FAIL_TO_PASS test fails (5.x). Fail-only rows (5.x ``eval_type: fail_only``,
#   parsers that print failures only): a test passes unless reported FAILED or ERROR (stricter than 5.x, which
#   lets ERROR pass), and an empty map is a clean run only with the harness's own evidence that the runner
#   executed tests (5.x ``SUITE_RAN``).
# - Markers: when the harness brackets test output, a log lacking either marker is ``missing_test_markers``
#   (as 4.1 and 5.x refuse it), for every patch kind. When the marked section parses to nothing, the log from
#   the start marker on is read (upstream reads the whole log; stricter: the install output before the marker
#   is printed by the patched code and never counts).
# - Statuses: the harness parser's map, completed by pytest's verbose ``path::test STATUS`` lines for ids the
#   parser lacks (SWE-smith's logs have verbose PASSED lines and a summary of FAILED ones).
# - A test one line reports passing and another FAILED, ERROR or SKIPPED is a contradiction, as is a non-zero
#   test exit code with no failing test (5.x's rule). A duplicate is the SAME passing status line printed
#   twice (progress suffix and spacing aside): the ``-rA`` parsers cut ids at the first space, so several real
#   tests (``test_x[a b]``, ``test_x[a c]``) share one key through different lines, and that is not a forgery.
#   Stricter than upstream, which has no duplicate rule.
# - Truncated ids: an expected id with more ``[`` than ``]`` (cut at a space, kept so in datasets) matches the
#   parsed ids it prefixes when they all agree on pass-or-not, else it fails as ``ambiguous`` (5.x).
# - ``failure_reason`` is a stable code (``FAILURE_REASONS``: the first failing check); ``failure_detail`` in
#   the marker payload counts every failure, e.g. ``fail_to_pass_failure: 2 of 3 (a=FAILED, b=absent);
#   pass_to_pass_regression: 71 of 159 (c=ERROR, d=FAILED, e=absent, +68 more)``.

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

    @property
    def failure_detail(self) -> str | None:
        """The grade's full account of the failure (counts and names), when the marker carries one."""
        return self.details.get("failure_detail") or self.failure_reason

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


def price_tampering(result: RewardResult, tampered: float) -> RewardResult:
    """The training reward of a graded sample: ``tampered`` (``train.reward.tampered``, <= 0) for a
    ``runner_tampered`` verdict, else ``result`` as it is.

    At 0 a forger that guesses which tests are the host's loses nothing by guessing wrong; below 0 a guess
    that is caught costs more than the unresolved 0 it replaces, so guessing loses on average unless it
    beats the canaries more often than ``-tampered / (1 - tampered)`` of the time."""
    if result.failure_reason != RUNNER_TAMPERED or result.reward == tampered:
        return result
    return replace(result, reward=float(tampered))
