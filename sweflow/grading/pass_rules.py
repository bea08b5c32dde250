"""Which parsed test statuses count as a pass, as named rules: grading's and SWE-smith's validation differ.

``harness``: SWE-bench's grading (PASSED or XFAIL; `sweflow.harness.driver` applies it inside the eval
program). ``swesmith``: SWE-smith's task validation (PASSED only; SKIPPED, XFAIL, XPASS, ERROR and FAILED
are not, nor is a test absent from the log). A caller names the rule it follows.
"""

from __future__ import annotations

from ..harness.driver import PASSING_STATUSES

PASS_RULES: dict[str, frozenset[str]] = {
    "harness": frozenset(PASSING_STATUSES),
    "swesmith": frozenset({"PASSED"}),
}


def passes(rule: str, status: str | None) -> bool:
    """Whether `status` (None: the test is absent) is a pass under the named rule."""
    try:
        return status in PASS_RULES[rule]
    except KeyError:
        raise ValueError(f"no pass rule {rule!r} (known: {', '.join(sorted(PASS_RULES))})") from None
