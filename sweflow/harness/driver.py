"""Grading driver shared by the host and the in-sandbox standalone parser program.

This file is imported on the host (``from sweflow.harness.driver import grade``) AND embedded verbatim, as
text, at the top of the standalone program that runs inside a task sandbox (see ``standalone.py``), so the
grade a sandbox prints and the grade the host computes come from the same code. Therefore it must:
import only the standard library, run on Python 3.7+ (sandbox interpreters are old), and define no
``if __name__ == "__main__"`` block (the generated program appends its own entry point).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field

# A test passes iff its status is one of these (the harness grading rule).
PASSING_STATUSES = ("PASSED", "XFAIL")
# Statuses that contradict a PASSED report of the same test.
FAILING_STATUSES = ("FAILED", "ERROR")
TEST_EXIT_CODE_MARKER = "SWEFLOW_TEST_EXIT_CODE="
DEFAULT_REWARD_MARKER = "SWEFLOW_REWARD_JSON="
TIMEOUT_RETURNCODES = (124, 137)  # `timeout` exit status; 137 when it had to SIGKILL (-k)
LOG_TAIL_CHARS = 2000
_WORDS = re.compile(r"[\s:()\[\],]+")

FAILURE_REASONS = (
    "missing_parser",
    "parser_exception",
    "no_tests_parsed",
    "fail_to_pass_failure",
    "pass_to_pass_regression",
    "eval_timeout",
    "log_contradicts_exit_code",
    "duplicate_status_lines",
)


@dataclass
class GradeResult:
    """The verdict for one evaluation; ``to_marker_dict`` is what the marker line carries."""

    resolved: bool
    fail_to_pass_success: int
    fail_to_pass_total: int
    pass_to_pass_success: int
    pass_to_pass_total: int
    parsed_tests: int
    eval_returncode: int | None = None
    test_exit_code: int | None = None
    failure_reason: str | None = None
    log_tail: str = ""
    failed_tests: list = field(default_factory=list)

    def to_marker_dict(self) -> dict:
        return asdict(self)


def test_passes(name: str, statuses: dict) -> bool:
    """True iff the test's parsed status is PASSED or XFAIL (absent tests do not pass)."""
    return statuses.get(name) in PASSING_STATUSES


def grade(
    statuses: dict,
    fail_to_pass: list,
    pass_to_pass: list,
    test_exit_code: int | None = None,
    *,
    eval_returncode: int | None = None,
    contradicted: list | tuple = (),
    duplicated: list | tuple = (),
    log_tail: str = "",
) -> GradeResult:
    """Grade parsed test statuses against the expected F2P/P2P lists.

    Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passes, the evaluation did not time out,
    some tests were parsed, no required test was reported both passing and failing (``contradicted``)
    and, when the test command's exit code is known, it does not contradict an all-passing log, and no
    required test was reported passing by more than one line (``duplicated``: a test runner reports each
    test once; a second PASSED line was printed by something else). ``failure_reason`` is the first failing
    check, in the order: timeout, nothing parsed, F2P, P2P, contradiction, duplicate.
    """
    f2p_ok = [t for t in fail_to_pass if test_passes(t, statuses)]
    p2p_ok = [t for t in pass_to_pass if test_passes(t, statuses)]
    failed = [t for t in list(fail_to_pass) + list(pass_to_pass) if not test_passes(t, statuses)]
    required = set(fail_to_pass) | set(pass_to_pass)
    bad_required = sorted(t for t in contradicted if t in required)
    dup_required = sorted(t for t in duplicated if t in required)
    any_failing = any(s in FAILING_STATUSES for s in statuses.values())

    reason = None
    if eval_returncode in TIMEOUT_RETURNCODES:
        reason = "eval_timeout"
    elif not statuses:
        reason = "no_tests_parsed"
    elif len(f2p_ok) != len(fail_to_pass):
        reason = "fail_to_pass_failure"
    elif len(p2p_ok) != len(pass_to_pass):
        reason = "pass_to_pass_regression"
    elif bad_required or (test_exit_code not in (None, 0) and not any_failing):
        reason = "log_contradicts_exit_code"
    elif dup_required:
        reason = "duplicate_status_lines"
    return GradeResult(
        resolved=reason is None,
        fail_to_pass_success=len(f2p_ok),
        fail_to_pass_total=len(fail_to_pass),
        pass_to_pass_success=len(p2p_ok),
        pass_to_pass_total=len(pass_to_pass),
        parsed_tests=len(statuses),
        eval_returncode=eval_returncode,
        test_exit_code=test_exit_code,
        failure_reason=reason,
        log_tail=log_tail,
        failed_tests=sorted(set(failed))[:50],
    )


def failed_grade(
    reason: str,
    fail_to_pass: list,
    pass_to_pass: list,
    *,
    eval_returncode=None,
    test_exit_code=None,
    log_tail="",
) -> GradeResult:
    """A not-resolved verdict for failures before grading (missing parser, parser exception)."""
    return GradeResult(
        resolved=False,
        fail_to_pass_success=0,
        fail_to_pass_total=len(fail_to_pass),
        pass_to_pass_success=0,
        pass_to_pass_total=len(pass_to_pass),
        parsed_tests=0,
        eval_returncode=eval_returncode,
        test_exit_code=test_exit_code,
        failure_reason=reason,
        log_tail=log_tail,
    )


def read_test_exit_code(log: str) -> int | None:
    """The exit code echoed by the instrumentation line; the last exact-prefix line wins (xtrace lines start with '+')."""
    code = None
    for m in re.finditer("^" + re.escape(TEST_EXIT_CODE_MARKER) + r"(\d+)\s*$", log, re.MULTILINE):
        code = int(m.group(1))
    return code


def test_section(log: str, start: str | None, end: str | None) -> str:
    """The text between the first start marker and the next end marker (as the harness grader splits), or ''."""
    if not start or not end or start not in log:
        return ""
    return log.split(start, 1)[1].split(end, 1)[0]


def from_first_start(log: str, start: str | None) -> str:
    """The log from the first start marker on: where test output, and anything the tests print, can appear."""
    i = log.find(start) if start else -1
    return log[i:] if i >= 0 else log


def parse_statuses(parser, log: str, spec, start: str, end: str) -> dict:
    """Run the harness parser the way the harness grader does: the marked test section, else the whole log."""
    section = test_section(log, start, end)
    statuses = call_parser(parser, section, spec) if section else {}
    if not statuses:
        statuses = call_parser(parser, log, spec)
    return dict(statuses)


def call_parser(parser, text: str, spec) -> dict:
    """Parsers take (log, test_spec) in newer harnesses and (log) in older ones."""
    try:
        return parser(text, spec)
    except TypeError as exc:
        if "positional argument" not in str(exc):
            raise
        return parser(text)


def line_statuses(parser, text: str, spec, names) -> dict:
    """For each test in ``names``: the list of statuses, one per log line the parser maps to it.

    Parsing line by line reveals what the harness's last-line-wins map hides: a forged ``PASSED x``
    printed after the real ``FAILED x``, or printed twice.
    """
    wanted = set(names)
    # A line can only report a wanted test if it holds that test's short name as a word: skip the rest
    # without calling the parser (a log of junk lines must not cost a parser call per line).
    short = set()
    for name in wanted:
        short.update(w for w in _WORDS.split(name) if w)
    seen = {}
    for line in text.split("\n"):
        if not line.strip() or not any(w in short for w in _WORDS.split(line)):
            continue
        try:
            found = call_parser(parser, line, spec)
        except Exception:  # a parser may choke on a lone line; the full parse already succeeded
            continue
        for test, status in found.items():
            if test in wanted:
                seen.setdefault(test, []).append(status)
    return seen


def contradicted_tests(per_line: dict) -> list:
    """Tests that some line reports passing and another FAILED/ERROR (``per_line`` from ``line_statuses``)."""
    return sorted(
        t for t, st in per_line.items() if set(st) & set(PASSING_STATUSES) and set(st) & set(FAILING_STATUSES)
    )


def duplicated_tests(per_line: dict) -> list:
    """Tests that more than one line reports as passing (``per_line`` from ``line_statuses``)."""
    return sorted(t for t, st in per_line.items() if sum(s in PASSING_STATUSES for s in st) > 1)


class _Spec:
    """A stand-in for the harness TestSpec that parsers receive (they rarely read it)."""

    def __init__(self, meta: dict) -> None:
        self.instance_id = meta.get("instance_id", "")
        self.repo = meta.get("repo", "")
        self.version = meta.get("version", "")
        self.FAIL_TO_PASS = list(meta.get("FAIL_TO_PASS", []))
        self.PASS_TO_PASS = list(meta.get("PASS_TO_PASS", []))


def evaluate_log(
    parser,
    log: str,
    meta: dict,
    eval_returncode,
    start: str,
    end: str,
    collect: dict | None = None,
    *,
    test_exit_code=None,
    trusted_exit_code: bool = False,
) -> GradeResult:
    """Parse and grade one evaluation log; never raises. ``collect`` receives the parsed statuses.

    With ``trusted_exit_code`` the test command's exit status is ``test_exit_code`` (the provider's own
    record of the process) and any exit-code line inside the log is ignored; otherwise it is read from
    the instrumentation line in the log (the in-sandbox evaluator, which trusts the sandbox).
    """
    f2p = list(meta.get("FAIL_TO_PASS", []))
    p2p = list(meta.get("PASS_TO_PASS", []))
    tail = log[-LOG_TAIL_CHARS:]
    exit_code = test_exit_code if trusted_exit_code else read_test_exit_code(log)
    if parser is None:
        return failed_grade("missing_parser", f2p, p2p, eval_returncode=eval_returncode, log_tail=tail)
    spec = _Spec(meta)
    try:
        statuses = parse_statuses(parser, log, spec, start, end)
        if collect is not None:
            collect.update(statuses)
        per_line = line_statuses(parser, from_first_start(log, start), spec, f2p + p2p)
        contradicted = contradicted_tests(per_line)
        duplicated = duplicated_tests(per_line)
    except Exception as exc:
        tail = (tail + "\nparser exception: " + repr(exc))[-LOG_TAIL_CHARS:]
        return failed_grade(
            "parser_exception",
            f2p,
            p2p,
            eval_returncode=eval_returncode,
            test_exit_code=exit_code,
            log_tail=tail,
        )
    return grade(
        statuses,
        f2p,
        p2p,
        exit_code,
        eval_returncode=eval_returncode,
        contradicted=contradicted,
        duplicated=duplicated,
        log_tail=tail,
    )


def marker_line(result: GradeResult, marker: str = DEFAULT_REWARD_MARKER) -> str:
    """The single reward line: the marker followed by compact, key-sorted JSON."""
    return marker + json.dumps(result.to_marker_dict(), sort_keys=True, separators=(",", ":"))


def main(argv, parser, start: str, end: str) -> int:
    """Entry point of the standalone program.

    ``--log F --tests F --eval-returncode N [--marker M] [--dump-statuses F]``; the last option writes the
    parsed status map as JSON (for debugging and tests); stdout gets only the marker line.
    """
    args = {"--marker": DEFAULT_REWARD_MARKER, "--eval-returncode": ""}
    it = iter(argv)
    for key in it:
        args[key] = next(it, "")
    rc_text = args.get("--eval-returncode", "")
    eval_rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    try:
        with open(args["--tests"], encoding="utf-8") as fh:
            meta = json.load(fh)
        with open(args["--log"], encoding="utf-8", errors="replace") as fh:
            log = fh.read()
        statuses = {}
        result = evaluate_log(parser, log, meta, eval_rc, start, end, statuses)
        if args.get("--dump-statuses"):
            with open(args["--dump-statuses"], "w", encoding="utf-8") as fh:
                json.dump(statuses, fh, sort_keys=True)
    except Exception as exc:  # always print a marker: a silent crash would read as a missing marker
        result = failed_grade("parser_exception", [], [], eval_returncode=eval_rc, log_tail=repr(exc))
    sys.stdout.write(marker_line(result, args["--marker"]) + "\n")
    sys.stdout.flush()
    return 0
