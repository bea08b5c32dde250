"""Grading edge cases decided against upstream SWE-bench (rules documented in sweflow.grading.reward)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sweflow.harness import driver, load_harness

pytest.importorskip("swebench", reason="swebench 4.x is the harness the tests run against")

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
T = "tests/test_io.py"


@pytest.fixture(scope="module")
def h():
    return load_harness("swebench")


def _log(lines: list[str], rc: int = 0) -> str:
    body = "\n".join(lines)
    return f"+ git apply -v -\n: '{START}'\n{body}\n= 3 passed in 0.1s =\n: '{END}'\nSWEFLOW_TEST_EXIT_CODE={rc}\n"


def _grade(h, lines, f2p, p2p, rc=0, collect=None):
    parser = h.parser_for("pytest-dev/pytest")  # swebench's own pytest -rA parser
    meta = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "repo": "pytest-dev/pytest"}
    return driver.evaluate_log(parser, _log(lines, rc), meta, 0, START, END, collect)


def test_skipped_pass_to_pass_is_not_a_regression_but_skipped_fail_to_pass_fails(h):
    g = _grade(h, [f"PASSED {T}::test_new", f"SKIPPED {T}::test_net"], [f"{T}::test_new"], [f"{T}::test_net"])
    assert (g.resolved, g.pass_to_pass_success) == (True, 1)
    g = _grade(h, [f"SKIPPED {T}::test_new", f"PASSED {T}::test_old"], [f"{T}::test_new"], [f"{T}::test_old"])
    assert g.failure_reason == "fail_to_pass_failure"
    assert g.failure_detail == f"fail_to_pass_failure: 1 of 1 ({T}::test_new=SKIPPED)"


def test_a_forged_passed_line_after_a_real_skip_is_a_contradiction(h):
    lines = [f"SKIPPED {T}::test_new", f"PASSED {T}::test_new"]
    g = _grade(h, lines, [f"{T}::test_new"], [])
    assert g.failure_reason == "log_contradicts_exit_code" and "test_new" in g.failure_detail


def test_truncated_expected_id_matches_by_prefix_only_when_unambiguous(h):
    cut = f"{T}::test_grammar[log(photon"  # an expected id cut at a space, as in datasets
    lines = [f"PASSED {T}::test_grammar[log(photon)]", f"PASSED {T}::test_grammar[log(photon)-2]"]
    assert _grade(h, lines, [cut], []).resolved
    lines[1] = f"FAILED {T}::test_grammar[log(photon)-2] - assert 0"
    g = _grade(h, lines, [cut], [])
    assert g.failure_detail == f"fail_to_pass_failure: 1 of 1 ({cut}=ambiguous)"
    # a balanced id never matches by prefix
    assert not _grade(h, [f"PASSED {T}::test_a[x]-extra"], [f"{T}::test_a[x]"], []).resolved


def test_ids_with_spaces_match_exactly_and_the_rA_parser_cuts_them(h):
    full = f"{T}::test_p[a b]"
    got: dict = {}
    g = _grade(h, [f"PASSED {full}"], [full], [], collect=got)
    assert got == {f"{T}::test_p[a": "PASSED"} and g.failure_reason == "fail_to_pass_failure"
    assert _grade(h, [f"PASSED {full}"], [f"{T}::test_p[a"], []).resolved  # the cut id, as datasets keep it
    # the verbose form keeps the spaces
    got = {}
    assert _grade(h, [f"{full} PASSED [100%]"], [full], [], collect=got).resolved and got == {full: "PASSED"}


def test_verbose_path_test_status_logs_are_read_with_the_same_integrity_checks(h):
    f2p, p2p = [f"{T}::test_new"], [f"{T}::test_old", f"{T}::test_skip"]
    lines = [
        f"{T}::test_new PASSED  [ 33%]",
        f"{T}::test_old PASSED  [ 66%]",
        f"{T}::test_skip SKIPPED [100%]",
    ]
    assert _grade(h, lines, f2p, p2p).resolved
    assert _grade(h, lines + [f"{T}::test_new PASSED"], f2p, p2p).failure_reason == "duplicate_status_lines"
    forged = [f"{T}::test_new FAILED", *lines]
    assert _grade(h, forged, f2p, p2p).failure_reason == "log_contradicts_exit_code"
    g = _grade(h, lines, f2p, p2p, rc=1)
    assert g.failure_detail == "log_contradicts_exit_code: test exit code 1 but no test failed"
    assert _grade(h, ["collected 0 items"], f2p, p2p).failure_reason == "no_tests_parsed"


def test_failure_detail_counts_every_failing_test(h):
    f2p = [f"{T}::test_f{i}" for i in range(3)]
    p2p = [f"{T}::test_p{i}" for i in range(159)]
    lines = [f"PASSED {T}::test_f0", f"FAILED {T}::test_f1 - assert 0"]
    lines += [f"PASSED {t}" for t in p2p[71:]] + [f"ERROR {t}" for t in p2p[:70]]
    g = _grade(h, lines, f2p, p2p, rc=1)
    assert g.failure_reason == "fail_to_pass_failure"
    assert g.failure_detail == (
        f"fail_to_pass_failure: 2 of 3 ({T}::test_f1=FAILED, {T}::test_f2=absent); "
        f"pass_to_pass_regression: 71 of 159 ({T}::test_p0=ERROR, {T}::test_p1=ERROR, {T}::test_p2=ERROR,"
        " +68 more)"
    )
    assert (g.fail_to_pass_success, g.pass_to_pass_success, len(g.failed_tests)) == (1, 88, 50)
    only_p2p = _grade(h, [f"PASSED {t}" for t in f2p + p2p[:5]] + [f"FAILED {p2p[5]}"], f2p, p2p[:6], rc=1)
    assert only_p2p.failure_detail == f"pass_to_pass_regression: 1 of 6 ({p2p[5]}=FAILED)"


def test_the_sandbox_program_reports_the_same_detail(h, tmp_path):
    f2p, p2p = [f"{T}::test_new"], [f"{T}::test_old"]
    (tmp_path / "p.py").write_text(h.standalone_parser_source("pytest-dev/pytest"))
    lines = [f"FAILED {T}::test_new - x", f"{T}::test_old PASSED", f"FAILED {T}::test_gone - y"]
    (tmp_path / "log").write_text(_log(lines, 1))
    (tmp_path / "t.json").write_text(json.dumps({"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}))
    out = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "p.py"), "--log", str(tmp_path / "log")]
        + ["--tests", str(tmp_path / "t.json"), "--eval-returncode", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    host = _grade(h, lines, f2p, p2p + [f"{T}::test_gone"], rc=1)
    payload_host = json.loads(out.split("=", 1)[1])  # the program read the two-test list
    assert payload_host["failure_detail"] == f"fail_to_pass_failure: 1 of 1 ({T}::test_new=FAILED)"
    # a verbose PASSED line counts beside the summary's FAILED lines (both forms in one log)
    assert host.failure_detail == (
        f"fail_to_pass_failure: 1 of 1 ({T}::test_new=FAILED); pass_to_pass_regression: 1 of 2 ({T}::test_gone=FAILED)"
    )
