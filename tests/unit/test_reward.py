"""Marker line -> reward."""

from __future__ import annotations

import json

from sweflow.grading.reward import MALFORMED_MARKER, MISSING_MARKER, parse_marker, reward_from_output
from sweflow.harness.driver import GradeResult, marker_line


def _line(resolved: bool, reason: str | None = None) -> str:
    g = GradeResult(resolved, 1 if resolved else 0, 1, 2, 2, 5, 0, 0, reason, "tail SWEFLOW_REWARD_JSON={}")
    return marker_line(g)


def test_resolved_marker_gives_reward_one():
    out = "noise\n" + _line(True) + "\n"
    res = reward_from_output(out)
    assert (res.reward, res.resolved, res.failure_reason) == (1.0, True, None)
    assert res.details["parsed_tests"] == 5


def test_unresolved_marker_keeps_its_reason():
    res = reward_from_output(_line(False, "fail_to_pass_failure"))
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "fail_to_pass_failure")


def test_last_marker_line_wins_and_quoted_markers_do_not_count():
    out = (
        _line(True)
        + "\n"
        + _line(False, "eval_timeout")
        + "\n"
        + 'echo "x SWEFLOW_REWARD_JSON={\\"resolved\\":true}"\n'
    )
    res = reward_from_output(out)
    assert res.failure_reason == "eval_timeout" and res.reward == 0.0
    assert reward_from_output(_line(False, "eval_timeout") + "\r\n  " + _line(True) + "\r\n").reward == 1.0


def test_missing_and_malformed_markers():
    assert parse_marker("nothing here") is None
    assert reward_from_output("").failure_reason == MISSING_MARKER
    for bad in [
        "SWEFLOW_REWARD_JSON={not json",
        "SWEFLOW_REWARD_JSON=[1,2]",
        'SWEFLOW_REWARD_JSON={"resolved":"yes"}',
    ]:
        res = reward_from_output(bad)
        assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, MALFORMED_MARKER), bad
        assert res.details["raw"]


def test_resolved_true_with_a_failure_reason_is_not_rewarded():
    out = "SWEFLOW_REWARD_JSON=" + json.dumps(
        {"resolved": True, "failure_reason": "log_contradicts_exit_code"}
    )
    assert reward_from_output(out).reward == 0.0


def test_custom_marker():
    out = "MY=" + json.dumps({"resolved": True})
    assert reward_from_output(out, marker="MY=").reward == 1.0
    assert reward_from_output(out).failure_reason == MISSING_MARKER


def test_failure_detail_comes_from_the_marker_and_falls_back_to_the_reason():
    g = GradeResult(
        False,
        1,
        3,
        2,
        2,
        5,
        0,
        1,
        "fail_to_pass_failure",
        "",
        ["a", "b"],
        "fail_to_pass_failure: 2 of 3 (a=FAILED, b=absent)",
    )
    res = reward_from_output(marker_line(g))
    assert (res.failure_reason, res.failure_detail) == (
        "fail_to_pass_failure",
        "fail_to_pass_failure: 2 of 3 (a=FAILED, b=absent)",
    )
    assert reward_from_output("").failure_detail == MISSING_MARKER
