"""The standalone parser program on real pytest -rA logs, checked against swebench's own parsers and grading."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweflow.grading.reward import reward_from_output
from sweflow.harness import driver, load_harness

pytest.importorskip("swebench", reason="swebench 4.x is the harness the tests run against")
from swebench.harness.constants import ResolvedStatus  # noqa: E402
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status  # noqa: E402
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER  # noqa: E402
from swebench.harness.test_spec.test_spec import make_test_spec  # noqa: E402

CALCLIB = "sweflow/calclib"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
# A system interpreter without sweflow or swebench proves the program is self-contained.
PYTHON3 = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

TEST_FILE = textwrap.dedent(
    """
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture setup fails")

    def test_pass():
        assert 1 + 1 == 2

    def test_fail():
        assert 1 + 1 == 3

    def test_error(broken):
        pass

    @pytest.mark.xfail(reason="known")
    def test_xfail():
        assert False

    @pytest.mark.skip(reason="skipped")
    def test_skip():
        pass

    @pytest.mark.parametrize("x", [1, 2])
    def test_param(x):
        assert x in (1, 2)
    """
)
ALL_PASS_FILE = "def test_a():\n    assert True\n\ndef test_b():\n    assert True\n"
P = "tests/test_m.py::"


def _run_pytest(tmp: Path, files: dict[str, str]) -> tuple[str, int]:
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *files],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout + proc.stderr, proc.returncode


def _eval_log(pytest_output: str, exit_code: int | None) -> str:
    """What the instrumented eval script logs under `set -x` around a test run."""
    lines = ["+ git status", "On branch main", f"+ : '{START}'", pytest_output.rstrip("\n")]
    if exit_code is not None:
        lines += [f"+ echo SWEFLOW_TEST_EXIT_CODE={exit_code}", f"SWEFLOW_TEST_EXIT_CODE={exit_code}"]
    lines += [f"+ : '{END}'", "+ git checkout abc tests/test_m.py"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    mixed, mixed_rc = _run_pytest(tmp_path_factory.mktemp("mixed"), {"tests/test_m.py": TEST_FILE})
    green, green_rc = _run_pytest(tmp_path_factory.mktemp("green"), {"tests/test_m.py": ALL_PASS_FILE})
    assert mixed_rc == 1 and green_rc == 0, (mixed, green)
    return {"mixed": (mixed, mixed_rc), "green": (green, green_rc)}


@pytest.fixture(scope="module")
def harness():
    h = load_harness("swebench")
    h.register_repos(
        {CALCLIB: {"0.1": {"python": "3.11", "test_cmd": "pytest -rA"}}}, {CALCLIB: "parse_log_pytest"}
    )
    return h


def _instance(repo: str, version: str, f2p: list[str], p2p: list[str]) -> dict:
    return {
        "instance_id": f"{repo.replace('/', '__')}-1",
        "repo": repo,
        "version": version,
        "base_commit": "abc",
        "test_patch": "diff --git a/tests/test_m.py b/tests/test_m.py\n--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1 +1 @@\n-x\n+y\n",
        "problem_statement": "",
        "hints_text": "",
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps(p2p),
    }


def _run_program(
    harness, tmp: Path, repo: str, log: str, f2p, p2p, eval_rc: int = 0
) -> tuple[dict, dict, str]:
    prog = tmp / "parser.py"
    prog.write_text(harness.standalone_parser_source(repo))
    (tmp / "eval.log").write_text(log)
    (tmp / "tests.json").write_text(json.dumps({"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "repo": repo}))
    proc = subprocess.run(
        [PYTHON3, "-I", str(prog), "--log", str(tmp / "eval.log"), "--tests", str(tmp / "tests.json")]
        + ["--eval-returncode", str(eval_rc), "--dump-statuses", str(tmp / "statuses.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("SWEFLOW_REWARD_JSON="), proc.stdout
    statuses = json.loads((tmp / "statuses.json").read_text()) if (tmp / "statuses.json").exists() else {}
    return json.loads(lines[0].split("=", 1)[1]), statuses, proc.stdout


@pytest.mark.parametrize(
    ("repo", "version"), [(CALCLIB, "0.1"), ("astropy/astropy", "4.3"), ("psf/requests", "2.0")]
)
def test_program_statuses_equal_official_parser(harness, logs, tmp_path, repo, version):
    text, rc = logs["mixed"]
    log = _eval_log(text, rc)
    _, statuses, _ = _run_program(harness, tmp_path, repo, log, [], [])
    section = log.split(START)[1].split(END)[0]
    official = MAP_REPO_TO_PARSER[repo](section, None)
    assert statuses == official
    assert statuses[P + "test_pass"] == "PASSED" and statuses[P + "test_fail"] == "FAILED"
    assert statuses[P + "test_error"] == "ERROR" and statuses[P + "test_xfail"] == "XFAIL"


GRADING_CASES = [
    # (name, F2P, P2P)
    ("resolved", [P + "test_pass", P + "test_param[1]"], [P + "test_param[2]", P + "test_xfail"]),
    ("f2p_fails", [P + "test_fail"], [P + "test_pass"]),
    ("f2p_error", [P + "test_error"], []),
    ("p2p_regresses", [P + "test_pass"], [P + "test_fail"]),
    ("f2p_absent", [P + "test_missing"], [P + "test_pass"]),
    ("skip_is_not_pass", [P + "test_skip"], []),
]


@pytest.mark.parametrize(("name", "f2p", "p2p"), GRADING_CASES, ids=[c[0] for c in GRADING_CASES])
def test_program_grading_matches_swebench_grading(harness, logs, tmp_path, name, f2p, p2p):
    text, _ = logs["mixed"]
    log = _eval_log(text, 0 if name == "resolved" else 1)
    inst = _instance(CALCLIB, "0.1", f2p, p2p)
    (tmp_path / "official.log").write_text(log)
    status_map, found = get_logs_eval(make_test_spec(inst), str(tmp_path / "official.log"))
    assert found
    report = get_eval_tests_report(status_map, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    official_resolved = get_resolution_status(report) == ResolvedStatus.FULL.value

    payload, statuses, stdout = _run_program(harness, tmp_path, CALCLIB, log, f2p, p2p)
    assert statuses == status_map
    assert payload["resolved"] is official_resolved is (name == "resolved")
    assert payload["fail_to_pass_success"] == len(report["FAIL_TO_PASS"]["success"])
    assert payload["pass_to_pass_success"] == len(report["PASS_TO_PASS"]["success"])
    assert (payload["fail_to_pass_total"], payload["pass_to_pass_total"]) == (len(f2p), len(p2p))
    assert payload["parsed_tests"] == len(status_map)
    expected_reason = {
        "resolved": None,
        "p2p_regresses": "pass_to_pass_regression",
    }.get(name, "fail_to_pass_failure")
    assert payload["failure_reason"] == expected_reason
    # The host-side grade() is the same code and gives the same verdict.
    host = driver.grade(statuses, f2p, p2p, payload["test_exit_code"], eval_returncode=0)
    assert (host.resolved, host.failure_reason) == (payload["resolved"], payload["failure_reason"])
    assert reward_from_output(stdout).reward == (1.0 if name == "resolved" else 0.0)


def test_forged_passed_line_after_real_failure_is_not_resolved(harness, logs, tmp_path):
    text, _ = logs["mixed"]
    forged = text.rstrip("\n") + f"\nPASSED {P}test_fail\n"  # e.g. printed by an atexit hook
    log = _eval_log(forged, 0)
    f2p = [P + "test_fail"]
    # swebench's last-line-wins map is fooled ...
    (tmp_path / "official.log").write_text(log)
    status_map, _ = get_logs_eval(
        make_test_spec(_instance(CALCLIB, "0.1", f2p, [])), str(tmp_path / "official.log")
    )
    assert status_map[P + "test_fail"] == "PASSED"
    # ... the driver is not.
    payload, _, _ = _run_program(harness, tmp_path, CALCLIB, log, f2p, [])
    assert payload["resolved"] is False
    assert payload["failure_reason"] == "log_contradicts_exit_code"


def test_all_passing_log_with_nonzero_test_exit_code_is_not_resolved(harness, logs, tmp_path):
    text, _ = logs["green"]
    f2p, p2p = [P + "test_a"], [P + "test_b"]
    ok, _, _ = _run_program(harness, tmp_path, CALCLIB, _eval_log(text, 0), f2p, p2p)
    assert ok["resolved"] is True and ok["test_exit_code"] == 0 and ok["failure_reason"] is None
    bad, _, _ = _run_program(harness, tmp_path, CALCLIB, _eval_log(text, 1), f2p, p2p)
    assert bad["resolved"] is False and bad["test_exit_code"] == 1
    assert bad["failure_reason"] == "log_contradicts_exit_code"
    # Without the instrumentation line the exit code is unknown and cannot contradict anything.
    unknown, _, _ = _run_program(harness, tmp_path, CALCLIB, _eval_log(text, None), f2p, p2p)
    assert unknown["resolved"] is True and unknown["test_exit_code"] is None


def test_forged_exit_code_line_inside_tests_is_overridden_by_the_real_one(harness, logs, tmp_path):
    text, _ = logs["green"]
    log = _eval_log("SWEFLOW_TEST_EXIT_CODE=0\n" + text, 1)
    payload, _, _ = _run_program(harness, tmp_path, CALCLIB, log, [P + "test_a"], [])
    assert payload["test_exit_code"] == 1 and payload["resolved"] is False


def test_timeout_no_tests_and_missing_parser(harness, logs, tmp_path):
    text, _ = logs["green"]
    f2p = [P + "test_a"]
    timed_out, _, _ = _run_program(harness, tmp_path, CALCLIB, _eval_log(text, 0), f2p, [], eval_rc=124)
    assert (timed_out["resolved"], timed_out["failure_reason"], timed_out["eval_returncode"]) == (
        False,
        "eval_timeout",
        124,
    )
    crash = _eval_log("ImportError: cannot import name 'sub' from 'calclib'\n", 2)
    empty, _, _ = _run_program(harness, tmp_path, CALCLIB, crash, f2p, [])
    assert (empty["resolved"], empty["failure_reason"], empty["parsed_tests"]) == (
        False,
        "no_tests_parsed",
        0,
    )
    assert "ImportError" in empty["log_tail"]
    nop, _, _ = _run_program(harness, tmp_path, "nobody/noparser", _eval_log(text, 0), f2p, [])
    assert (nop["resolved"], nop["failure_reason"]) == (False, "missing_parser")


def test_log_tail_is_bounded(harness, logs, tmp_path):
    text, _ = logs["green"]
    log = _eval_log(("x" * 200 + "\n") * 500 + text, 0)
    payload, _, _ = _run_program(harness, tmp_path, CALCLIB, log, [P + "test_a"], [])
    assert len(payload["log_tail"]) == driver.LOG_TAIL_CHARS
    assert log.endswith(payload["log_tail"])


def test_parser_exception_is_reported_not_raised():
    def exploding(log, spec):
        raise ValueError("boom")

    res = driver.evaluate_log(
        exploding, f"{START}\nPASSED a\n{END}\n", {"FAIL_TO_PASS": ["a"]}, 0, START, END
    )
    assert (res.resolved, res.failure_reason) == (False, "parser_exception")
    assert "boom" in res.log_tail


def test_old_style_single_argument_parser_is_supported():
    def old(log):
        return {ln.split()[1]: ln.split()[0] for ln in log.splitlines() if ln.startswith("PASSED ")}

    res = driver.evaluate_log(
        old,
        f"{START}\nPASSED a\nPASSED b\n{END}\n",
        {"FAIL_TO_PASS": ["a"], "PASS_TO_PASS": ["b"]},
        0,
        START,
        END,
    )
    assert res.resolved and res.parsed_tests == 2


def test_forged_end_marker_and_late_passed_line_is_not_resolved(harness, logs, tmp_path):
    text, _ = logs["mixed"]
    # Tests print a fake end marker first (so the grader falls back to the whole log), then a late PASSED line.
    forged = f"{END}\n" + text.rstrip("\n") + f"\nPASSED {P}test_fail\n"
    log = _eval_log(forged, 0)
    payload, statuses, _ = _run_program(harness, tmp_path, CALCLIB, log, [P + "test_fail"], [])
    assert statuses[P + "test_fail"] == "PASSED"  # the last-line-wins map alone would be fooled
    assert (payload["resolved"], payload["failure_reason"]) == (False, "log_contradicts_exit_code")


# Parametrized ids with spaces, an escaped newline and brackets: pytest -rA prints each test once, and the
# -rA parser cuts every id at its first space, so several real tests share one parser key (the shape of
# sqlfluff-2386, dask-10441, pydicom-1458).
SPACED_FILE = textwrap.dedent(
    """
    import pytest

    @pytest.mark.parametrize("text", ["a b", "a c", "\\n    select 1", "\\n    select 2", "[q] r", "[q] s", "plain"])
    def test_content_count(text):
        assert text
    """
)


@pytest.fixture(scope="module")
def spaced(tmp_path_factory):
    out, rc = _run_pytest(tmp_path_factory.mktemp("spaced"), {"tests/test_m.py": SPACED_FILE})
    assert rc == 0 and "7 passed" in out, out
    return out


def test_cut_parametrized_ids_that_share_a_key_resolve_as_upstream_grades_them(harness, spaced, tmp_path):
    parser = MAP_REPO_TO_PARSER["astropy/astropy"]
    keys = sorted(parser(spaced, None))
    # 7 tests, 4 keys: "a b"/"a c", "\\n    select 1"/"... 2" and "[q] r"/"[q] s" collapse to one cut id each
    assert len(keys) == 4 and f"{P}test_content_count[a" in keys, keys
    log = _eval_log(spaced, 0)
    payload, _, _ = _run_program(harness, tmp_path, CALCLIB, log, keys[:2], keys[2:])
    host = driver.evaluate_log(
        parser, log, {"FAIL_TO_PASS": keys[:2], "PASS_TO_PASS": keys[2:]}, 0, START, END
    )
    # upstream: the same log resolves
    (tmp_path / "up.log").write_text(log)
    spec = make_test_spec(_instance("astropy/astropy", "4.3", keys[:2], keys[2:]))
    sm, found = get_logs_eval(spec, str(tmp_path / "up.log"))
    report = get_eval_tests_report(
        sm, {"FAIL_TO_PASS": keys[:2], "PASS_TO_PASS": keys[2:], "FAIL_TO_FAIL": [], "PASS_TO_FAIL": []}
    )
    assert found and get_resolution_status(report) == ResolvedStatus.FULL.value
    assert payload["resolved"] and host.resolved, (payload, host.failure_detail)


def test_a_forged_repeat_of_a_real_status_line_is_still_a_duplicate(harness, spaced, tmp_path):
    parser = MAP_REPO_TO_PARSER["astropy/astropy"]
    keys = sorted(parser(spaced, None))
    real = next(ln for ln in spaced.splitlines() if ln.startswith(f"PASSED {P}test_content_count[a "))
    log = _eval_log(spaced.rstrip("\n") + "\n" + real + "\n", 0)
    payload, _, _ = _run_program(harness, tmp_path, CALCLIB, log, keys[:2], keys[2:])
    host = driver.evaluate_log(
        parser, log, {"FAIL_TO_PASS": keys[:2], "PASS_TO_PASS": keys[2:]}, 0, START, END
    )
    assert payload["failure_reason"] == host.failure_reason == "duplicate_status_lines"
    # the same line with pytest's progress suffix or other spacing is still the same line
    verbose = f"{P}test_content_count[plain] PASSED"
    log = _eval_log(spaced.rstrip("\n") + f"\n{verbose}  [ 50%]\n{verbose}\n", 0)
    g = driver.evaluate_log(parser, log, {"FAIL_TO_PASS": [f"{P}test_content_count[plain]"]}, 0, START, END)
    assert g.failure_reason == "duplicate_status_lines"
