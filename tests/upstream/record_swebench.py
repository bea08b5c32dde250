"""Run SWE-bench's own parser and grading tests and record every call they check, as JSON cases.

Usage: ``python -m tests.upstream.record_swebench TESTS_DIR OUT.json`` with swebench 5.x first on
``sys.path``. The grading functions and log parsers are wrapped before the tests import them; a call is
kept only when the upstream test it ran in passed, so each recorded output is one that upstream's own
assertions accept: the expected answer for sweflow.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import pytest

FILES = ("test_log_parsers_*.py", "test_grading_*.py")
GRADING = ("test_passed", "test_failed", "test_maintained", "get_logs_eval", "get_eval_tests_report")


class Recorder:
    """Collects calls per upstream test; ``cases`` keeps those of the tests that passed."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.calls: dict[str, list] = {}
        self.passed: set[str] = set()
        self.reports: dict[int, dict] = {}

    def add(self, case: dict) -> dict:
        if self.current is not None:
            calls = self.calls.setdefault(self.current, [])
            case["id"] = f"{self.current}#{len(calls)}"
            calls.append(case)
        return case

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.current = item.nodeid
        yield
        self.current = None

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed.add(report.nodeid)

    def cases(self) -> list[dict]:
        return [c for test in sorted(self.passed) for c in self.calls.get(test, [])]


def _spec_fields(spec) -> dict:
    return {
        k: getattr(spec, k, None)
        for k in ("instance_id", "repo", "version", "log_parser", "FAIL_TO_PASS", "PASS_TO_PASS")
    } | {"eval_type": str(getattr(getattr(spec, "eval_type", None), "value", getattr(spec, "eval_type", "")))}


def _wrap_parser(rec: Recorder, name: str, fn):
    @functools.wraps(fn)
    def parser(log, test_spec=None, *args, **kwargs):
        out = fn(log, test_spec, *args, **kwargs)
        rec.add({"kind": "parser", "parser": name, "log": log, "expected": dict(out)})
        return out

    return parser


def _wrap_grading(rec: Recorder, name: str, fn):
    @functools.wraps(fn)
    def graded(*args, **kwargs):
        out = fn(*args, **kwargs)
        if name == "get_logs_eval":
            spec, path = args[:2]
            rec.add(
                {
                    "kind": "logs_eval",
                    "spec": _spec_fields(spec),
                    "log": Path(path).read_text(),
                    "expected": {"statuses": dict(out[0]), "found": bool(out[1])},
                }
            )
        elif name == "get_eval_tests_report":
            sm, gold = args[:2]
            eval_type = kwargs.get("eval_type", args[3] if len(args) > 3 else "pass_and_fail")
            case = rec.add(
                {
                    "kind": "eval_report",
                    "statuses": dict(sm),
                    "FAIL_TO_PASS": list(gold["FAIL_TO_PASS"]),
                    "PASS_TO_PASS": list(gold["PASS_TO_PASS"]),
                    "eval_type": str(getattr(eval_type, "value", eval_type)),
                    "expected": {k: out[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")},
                }
            )
            rec.reports[id(out)] = case
        else:
            case, sm = args[:2]
            rec.add({"kind": name, "test": case, "statuses": dict(sm), "expected": bool(out)})
        return out

    return graded


def _wrap_resolution(rec: Recorder, fn):
    @functools.wraps(fn)
    def resolution(report, *args, **kwargs):
        out = fn(report, *args, **kwargs)
        case = rec.reports.get(id(report))
        if case is not None:
            case["expected"]["resolution"] = str(out)
        return out

    return resolution


def install(rec: Recorder) -> None:
    """Wrap every ``parse_log_*`` of swebench's parser modules and the grading functions, in place."""
    import swebench.harness.grading as grading
    import swebench.harness.log_parsers as parsers

    for info in pkgutil.iter_modules(parsers.__path__):
        mod = importlib.import_module(f"{parsers.__name__}.{info.name}")
        for name, fn in list(vars(mod).items()):
            if (
                name.startswith("parse_log_")
                and callable(fn)
                and getattr(fn, "__module__", "") == mod.__name__
            ):
                setattr(mod, name, _wrap_parser(rec, name, fn))
    for name in GRADING:
        setattr(grading, name, _wrap_grading(rec, name, getattr(grading, name)))
    grading.get_resolution_status = _wrap_resolution(rec, grading.get_resolution_status)


def main(argv: list[str]) -> int:
    tests_dir, out = Path(argv[0]), Path(argv[1])
    rec = Recorder()
    install(rec)
    files = sorted(str(p) for pattern in FILES for p in tests_dir.glob(pattern))
    code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(tests_dir), *files], plugins=[rec])
    cases = rec.cases()
    out.write_text(json.dumps({"pytest_exit": int(code), "files": files, "cases": cases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
