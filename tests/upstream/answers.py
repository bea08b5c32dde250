"""sweflow's answers to upstream cases, for one harness package: ``python -m tests.upstream.answers
PACKAGE CASES.json OUT.json`` (the harness package importable as PACKAGE, e.g. swebench 4.1 or 5.x).

For each case: ``sweflow`` is what sweflow's grading layer answers and ``harness`` what the harness
package's own function answers, so a disagreement can be told apart as sweflow's or the harness version's.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from sweflow.errors import HarnessError
from sweflow.harness import driver, load_harness
from sweflow.smith.bug_validation import classify

PASSING = driver.PASSING_STATUSES


def _parser(h, name: str):
    try:
        return h.find_parser(name)
    except HarnessError:
        return None


# swebench 5.x's record of the test command's status; sweflow takes that status from the provider, so a
# case's record stands for the provider's, whichever harness version reads the log
_UPSTREAM_EXIT = re.compile(r">>>>> Test Exit Code:\s*(-?\d+)")


def _exit_code(log: str):
    m = _UPSTREAM_EXIT.search(log)
    return int(m.group(1)) if m else None


def _spec_meta(h, spec: dict) -> dict:
    meta = {k: spec.get(k) or "" for k in ("instance_id", "repo", "version")}
    meta["FAIL_TO_PASS"], meta["PASS_TO_PASS"] = [], []
    if spec.get("eval_type") == driver.EVAL_TYPE_FAIL_ONLY:
        meta.update(eval_type=driver.EVAL_TYPE_FAIL_ONLY, suite_ran=h.suite_ran_pattern)
    return meta


def parser_case(h, case: dict) -> dict:
    parser = _parser(h, case["parser"])
    if parser is None:
        return {"sweflow": "missing parser", "harness": "missing parser"}
    try:
        raw = dict(driver.call_parser(parser, case["log"], None))
    except Exception as exc:  # noqa: BLE001 - the harness's own parser fails on this log
        raw = f"exception: {type(exc).__name__}: {exc}"
    try:
        ours = driver.status_map(parser, case["log"], None)
    except Exception as exc:  # noqa: BLE001
        ours = f"exception: {type(exc).__name__}: {exc}"
    return {"sweflow": ours, "harness": raw}


def logs_eval_case(h, case: dict) -> dict:
    spec, log = case["spec"], case["log"]
    parser = _parser(h, spec["log_parser"]) if spec.get("log_parser") else h.parser_for(spec["repo"])
    if parser is None:
        return {"sweflow": "missing parser", "harness": "missing parser"}
    statuses: dict = {}
    g = driver.evaluate_log(
        parser,
        log,
        _spec_meta(h, spec),
        None,
        h.start_marker,
        h.end_marker,
        statuses,
        test_exit_code=_exit_code(log),
        trusted_exit_code=True,
    )
    found = g.failure_reason is None
    ours = {"statuses": statuses if found else {}, "found": found, "reason": g.failure_reason}
    return {"sweflow": ours}


def predicate_case(case: dict) -> dict:
    test, sm = case["test"], case["statuses"]
    ours = {
        "test_passed": driver.test_passes(test, sm),
        "test_failed": not driver.test_passes(test, sm),
        "test_maintained": driver.test_maintained(test, sm),
    }[case["kind"]]
    return {"sweflow": ours}


def eval_report_case(case: dict) -> dict:
    sm, f2p, p2p = case["statuses"], case["FAIL_TO_PASS"], case["PASS_TO_PASS"]
    fail_only = case.get("eval_type") == driver.EVAL_TYPE_FAIL_ONLY
    g = driver.grade(sm, f2p, p2p, fail_only=fail_only, suite_ran=True)
    ok_f = [t for t in f2p if driver.test_passes(t, sm, fail_only)]
    ok_p = [t for t in p2p if driver.test_maintained(t, sm, fail_only)]
    ours = {
        "FAIL_TO_PASS": {"success": ok_f, "failure": [t for t in f2p if t not in ok_f]},
        "PASS_TO_PASS": {"success": ok_p, "failure": [t for t in p2p if t not in ok_p]},
        "resolved": g.resolved,
    }
    return {"sweflow": ours}


def _smith_statuses(h, parser, log: str) -> dict:
    return driver.parse_statuses(parser, log, None, h.start_marker, h.end_marker)


def smith_validation_case(h, case: dict) -> dict:
    parser = _parser(h, case["parser"])
    bug, ref = _smith_statuses(h, parser, case["bug_log"]), _smith_statuses(h, parser, case["reference_log"])
    split = classify(sorted(t for t, s in ref.items() if s == driver.PASSING_STATUSES[0]), [bug])
    return {"sweflow": {k: sorted(split[k]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}}


def smith_evaluation_case(h, case: dict) -> dict:
    parser = _parser(h, case["parser"])
    meta = {"FAIL_TO_PASS": case["FAIL_TO_PASS"], "PASS_TO_PASS": case["PASS_TO_PASS"]}
    statuses: dict = {}
    g = driver.evaluate_log(parser, case["log"], meta, 0, h.start_marker, h.end_marker, statuses)
    ok_f = [t for t in meta["FAIL_TO_PASS"] if driver.test_passes(t, statuses)]
    ok_p = [t for t in meta["PASS_TO_PASS"] if driver.test_maintained(t, statuses)]
    return {
        "sweflow": {
            "resolved": g.resolved,
            "reason": g.failure_reason,
            "FAIL_TO_PASS": sorted(ok_f),
            "PASS_TO_PASS": sorted(ok_p),
        }
    }


def smith_parser_case(h, case: dict) -> dict:
    parser = _parser(h, case["parser"])
    if parser is None:
        return {"sweflow": "missing parser", "harness": "missing parser"}
    sm = driver.status_map(parser, case["log"], None)
    return {"sweflow": {t: sm.get(t, "absent") for t in case["expected"]}}


def answer(h, case: dict) -> dict[str, Any]:
    kind = case["kind"]
    try:
        if kind == "parser":
            return parser_case(h, case)
        if kind == "logs_eval":
            return logs_eval_case(h, case)
        if kind in ("test_passed", "test_failed", "test_maintained"):
            return predicate_case(case)
        if kind == "eval_report":
            return eval_report_case(case)
        return {
            "smith_validation": smith_validation_case,
            "smith_evaluation": smith_evaluation_case,
            "smith_parser": smith_parser_case,
        }[kind](h, case)
    except Exception as exc:  # noqa: BLE001 - a crash is an answer that disagrees, with its reason
        return {"sweflow": f"exception: {type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    package, cases_path, out = argv
    h = load_harness(package)
    version = getattr(sys.modules.get(package), "__version__", "?")
    cases = json.loads(open(cases_path).read())
    answers = {c["id"]: answer(h, c) for c in cases}
    with open(out, "w") as fh:
        json.dump({"package": package, "version": version, "answers": answers}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
