"""Grading driver shared by the host and the in-sandbox standalone parser program.

Imported on the host AND embedded verbatim, as text, in the program a task sandbox runs (``standalone.py``),
so it imports only the standard library, runs on Python 3.7+ and defines no ``if __name__ == "__main__"``
block; the reasons are in the comment after the imports.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field

# This file is imported on the host (``from sweflow.harness.driver import grade``) AND embedded verbatim, as
# text, at the top of the standalone program that runs inside a task sandbox (see ``standalone.py``), so the
# grade a sandbox prints and the grade the host computes come from the same code. Therefore it must: import
# only the standard library, run on Python 3.7+ (sandbox interpreters are old), and define no ``if __name__ ==
# "__main__"`` block (the generated program appends its own entry point).

# A test passes iff its status is one of these (the harness grading rule).
PASSING_STATUSES = ("PASSED", "XFAIL")
# Statuses that contradict a PASSED report of the same test (with SKIPPED, see CONTRADICTING_STATUSES).
FAILING_STATUSES = ("FAILED", "ERROR")
SKIPPED_STATUS = "SKIPPED"
CONTRADICTING_STATUSES = FAILING_STATUSES + (SKIPPED_STATUS,)
TEST_EXIT_CODE_MARKER = "SWEFLOW_TEST_EXIT_CODE="
DEFAULT_REWARD_MARKER = "SWEFLOW_REWARD_JSON="
TIMEOUT_RETURNCODES = (124, 137)  # `timeout` exit status; 137 when it had to SIGKILL (-k)
LOG_TAIL_CHARS = 2000
DETAIL_NAMES = 3  # test names a failure detail lists before "+N more"
_WORDS = re.compile(r"[\s:()\[\],]+")
# pytest's verbose form, as SWE-smith's logs have it: "<path>::<test id> STATUS   [ 42%]" (ids may hold spaces)
_VERBOSE_LINE = re.compile(r"^(\S+?::.+?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL)(?: +\[ *\d+%\])?\s*$")

EVAL_TYPE_FAIL_ONLY = "fail_only"  # swebench 5.x: the parser records failures only; absent = passed
# pytest's progress suffix and runs of blanks: two status lines are the same line when equal without them
_PROGRESS = re.compile(r"\s*\[ *\d+%\]\s*$")
_BLANKS = re.compile(r"\s+")

FAILURE_REASONS = (
    "missing_parser",
    "missing_test_markers",
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
    """The verdict for one evaluation; ``to_marker_dict`` is what the marker line carries.

    ``failure_reason`` is a stable code (one of FAILURE_REASONS); ``failure_detail`` says it in full,
    counting every failing test, e.g. ``pass_to_pass_regression: 71 of 159 (a=FAILED, b=absent, c=ERROR,
    +68 more)``.
    """

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
    failure_detail: str | None = None

    def to_marker_dict(self) -> dict:
        return asdict(self)


def resolve_test(name: str, statuses: dict) -> list:
    """The keys of ``statuses`` that report the expected test ``name`` (empty: not reported).

    Exact id first. An id with more ``[`` than ``]`` was truncated mid-parameter (the pytest ``-rA``
    parsers cut ids at the first space, and datasets kept those cut ids): it matches every parsed id it
    prefixes, but only when they all agree on pass-or-not (else it is ambiguous and reported as absent).
    Any other id, spaces included, matches exactly only.
    """
    if name in statuses:
        return [name]
    if name.count("[") > name.count("]"):
        keys = sorted(k for k in statuses if k.startswith(name))
        if keys and len({statuses[k] in PASSING_STATUSES for k in keys}) == 1:
            return keys
    return []


def test_passes(name: str, statuses: dict, fail_only: bool = False) -> bool:
    """True iff the test's parsed status is PASSED or XFAIL (absent tests do not pass).

    ``fail_only`` (a parser that records failures only): a test passes unless reported FAILED or ERROR.
    """
    keys = resolve_test(name, statuses)
    if fail_only:
        return not any(statuses[k] in FAILING_STATUSES for k in keys)
    return bool(keys) and all(statuses[k] in PASSING_STATUSES for k in keys)


def test_maintained(name: str, statuses: dict, fail_only: bool = False) -> bool:
    """A PASS_TO_PASS test holds iff it passes or was SKIPPED (a skip is not a regression)."""
    keys = resolve_test(name, statuses)
    if fail_only:
        return not any(statuses[k] in FAILING_STATUSES for k in keys)
    return bool(keys) and all(statuses[k] in PASSING_STATUSES + (SKIPPED_STATUS,) for k in keys)


def _status_of(name: str, statuses: dict) -> str:
    keys = resolve_test(name, statuses)
    if keys:
        return "/".join(sorted({statuses[k] for k in keys}))
    return "ambiguous" if any(k.startswith(name) for k in statuses) and "[" in name else "absent"


def _names(tests: list) -> str:
    more = f", +{len(tests) - DETAIL_NAMES} more" if len(tests) > DETAIL_NAMES else ""
    return f"{len(tests)} required tests ({', '.join(tests[:DETAIL_NAMES])}{more})"


def _count_detail(code: str, failing: list, total: int, statuses: dict) -> str:
    names = [f"{t}={_status_of(t, statuses)}" for t in failing[:DETAIL_NAMES]]
    if len(failing) > DETAIL_NAMES:
        names.append(f"+{len(failing) - DETAIL_NAMES} more")
    return f"{code}: {len(failing)} of {total} ({', '.join(names)})"


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
    fail_only: bool = False,
    suite_ran: bool = False,
) -> GradeResult:
    """Grade parsed test statuses against the expected F2P/P2P lists (the rules: ``sweflow.reward``).

    Resolved iff every FAIL_TO_PASS test passes and every PASS_TO_PASS test passes or is skipped, the
    evaluation did not time out, some tests were parsed, no required test was reported both passing and
    failing or skipped (``contradicted``) and, when the test command's exit code is known, it does not
    contradict an all-passing log, and no required test was reported passing by more than one line
    (``duplicated``: a test runner reports each test once; a second PASSED line was printed by something
    else). ``failure_reason`` is the first failing check, in the order: timeout, nothing parsed, F2P, P2P,
    contradiction, duplicate; ``failure_detail`` counts every failing F2P and P2P test. ``fail_only``:
    the parser records failures only, so an absent test passes and an empty map is a clean run when
    ``suite_ran`` (the harness found evidence that the runner executed tests).
    """
    f2p_bad = [t for t in fail_to_pass if not test_passes(t, statuses, fail_only)]
    p2p_bad = [t for t in pass_to_pass if not test_maintained(t, statuses, fail_only)]
    required = set(fail_to_pass) | set(pass_to_pass)
    required |= {k for t in list(required) for k in resolve_test(t, statuses)}
    bad_required = sorted(t for t in contradicted if t in required)
    dup_required = sorted(t for t in duplicated if t in required)
    any_failing = any(s in FAILING_STATUSES for s in statuses.values())

    counts = []
    if f2p_bad:
        counts.append(_count_detail("fail_to_pass_failure", f2p_bad, len(fail_to_pass), statuses))
    if p2p_bad:
        counts.append(_count_detail("pass_to_pass_regression", p2p_bad, len(pass_to_pass), statuses))
    reason = detail = None
    if eval_returncode in TIMEOUT_RETURNCODES:
        reason, detail = "eval_timeout", f"eval_timeout: eval exit status {eval_returncode}"
    elif not statuses and not (fail_only and suite_ran):
        reason, detail = "no_tests_parsed", "no_tests_parsed: the parser found no test status in the log"
    elif counts:
        reason, detail = ("fail_to_pass_failure" if f2p_bad else "pass_to_pass_regression"), "; ".join(counts)
    elif bad_required:
        reason = "log_contradicts_exit_code"
        detail = f"{reason}: {_names(bad_required)} reported both passing and failing or skipped"
    elif test_exit_code not in (None, 0) and not any_failing:
        reason = "log_contradicts_exit_code"
        detail = f"{reason}: test exit code {test_exit_code} but no test failed"
    elif dup_required:
        reason = "duplicate_status_lines"
        detail = f"{reason}: {_names(dup_required)} reported passing by more than one line"
    return GradeResult(
        resolved=reason is None,
        fail_to_pass_success=len(fail_to_pass) - len(f2p_bad),
        fail_to_pass_total=len(fail_to_pass),
        pass_to_pass_success=len(pass_to_pass) - len(p2p_bad),
        pass_to_pass_total=len(pass_to_pass),
        parsed_tests=len(statuses),
        eval_returncode=eval_returncode,
        test_exit_code=test_exit_code,
        failure_reason=reason,
        log_tail=log_tail,
        failed_tests=sorted(set(f2p_bad + p2p_bad))[:50],
        failure_detail=detail,
    )


def failed_grade(
    reason: str,
    fail_to_pass: list,
    pass_to_pass: list,
    *,
    eval_returncode=None,
    test_exit_code=None,
    log_tail="",
    detail: str = "",
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
        failure_detail=f"{reason}: {detail}" if detail else reason,
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


def parse_log_pytest_verbose(log: str, test_spec=None) -> dict:
    """Statuses from pytest's verbose ``<path>::<id> STATUS`` lines (SWE-smith's logs); ids keep spaces."""
    found = {}
    for line in log.split("\n"):
        m = _VERBOSE_LINE.match(line.rstrip())
        if m:
            found[m.group(1)] = m.group(2)
    return found


def status_map(parser, text: str, spec) -> dict:
    """The harness parser's statuses, completed by pytest's verbose lines for ids the parser lacks.

    A log may hold both forms (``--verbose`` lines plus the ``-rA``/``--tb`` summary, which lists only
    failures when ``-rA`` is absent): reading the verbose form only when the parser found nothing lost
    every verbose PASSED line as soon as one summary ``FAILED`` line was there.
    """
    statuses = dict(call_parser(parser, text, spec)) if parser is not parse_log_pytest_verbose else {}
    for key, status in parse_log_pytest_verbose(text).items():
        statuses.setdefault(key, status)
    return statuses


def markers_missing(log: str, start: str | None, end: str | None) -> bool:
    """True when the harness brackets test output with markers and the log lacks either one."""
    return bool(start and end) and (start not in log or end not in log)


def parse_statuses(parser, log: str, spec, start: str, end: str) -> dict:
    """Statuses of the marked test section; when it holds none, of the log from the start marker on.

    Upstream falls back to the whole log; the part before the start marker is the install and setup
    output, which the patched code can print into (``pip install -e .`` runs it), so it never counts.
    """
    section = test_section(log, start, end)
    statuses = status_map(parser, section, spec) if section else {}
    if not statuses:
        statuses = status_map(parser, from_first_start(log, start), spec)
    return statuses


def call_parser(parser, text: str, spec) -> dict:
    """Parsers take (log, test_spec) in newer harnesses and (log) in older ones."""
    try:
        return parser(text, spec)
    except TypeError as exc:
        if "positional argument" not in str(exc):
            raise
        return parser(text)


def line_identity(line: str) -> str:
    """A status line as text, without pytest's progress suffix and with blanks collapsed."""
    return _BLANKS.sub(" ", _PROGRESS.sub("", line)).strip()


def line_statuses(parser, text: str, spec, names) -> dict:
    """For each test in ``names``: a list of ``(status, line identity)``, one per log line reporting it.

    Parsing line by line reveals what the harness's last-line-wins map hides: a forged ``PASSED x``
    printed after the real ``FAILED x``, or the same status line printed twice.
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
            found = status_map(parser, line, spec)
        except Exception:  # a parser may choke on a lone line; the full parse already succeeded
            continue
        for test, status in found.items():
            if test in wanted:
                seen.setdefault(test, []).append((status, line_identity(line)))
    return seen


def contradicted_tests(per_line: dict) -> list:
    """Tests one line reports passing and another FAILED/ERROR/SKIPPED (``per_line`` from ``line_statuses``)."""
    out = []
    for test, seen in per_line.items():
        statuses = {status for status, _ in seen}
        if statuses & set(PASSING_STATUSES) and statuses & set(CONTRADICTING_STATUSES):
            out.append(test)
    return sorted(out)


def duplicated_tests(per_line: dict) -> list:
    """Tests for which the same passing status line appears more than once (``per_line``: ``line_statuses``).

    Only a repeat of the same line counts: the ``-rA`` parsers cut ids at the first space, so several
    real tests (``test_x[a b]``, ``test_x[a c]``) map to one key through different lines, and a runner
    prints each test's line once.
    """
    out = []
    for test, seen in per_line.items():
        lines = [ident for status, ident in seen if status in PASSING_STATUSES]
        if len(lines) > len(set(lines)):
            out.append(test)
    return sorted(out)


class _Spec:
    """A stand-in for the harness TestSpec that parsers receive (they rarely read it)."""

    def __init__(self, meta: dict) -> None:
        self.instance_id = meta.get("instance_id", "")
        self.repo = meta.get("repo", "")
        self.version = meta.get("version", "")
        self.FAIL_TO_PASS = list(meta.get("FAIL_TO_PASS", []))
        self.PASS_TO_PASS = list(meta.get("PASS_TO_PASS", []))
        self.eval_type = meta.get("eval_type") or "pass_and_fail"


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
        return failed_grade(
            "missing_parser",
            f2p,
            p2p,
            eval_returncode=eval_returncode,
            log_tail=tail,
            detail=f"the harness has no log parser for {meta.get('repo') or 'this repo'}",
        )
    if markers_missing(log, start, end) and eval_returncode not in TIMEOUT_RETURNCODES:
        return failed_grade(
            "missing_test_markers",
            f2p,
            p2p,
            eval_returncode=eval_returncode,
            test_exit_code=exit_code,
            log_tail=tail,
            detail="the log lacks the harness's start or end test-output marker: the eval script did not run through",
        )
    spec = _Spec(meta)
    fail_only = spec.eval_type == EVAL_TYPE_FAIL_ONLY
    try:
        statuses = parse_statuses(parser, log, spec, start, end)
        if collect is not None:
            collect.update(statuses)
        wanted = set(f2p + p2p) | {k for t in f2p + p2p for k in resolve_test(t, statuses)}
        per_line = line_statuses(parser, from_first_start(log, start), spec, sorted(wanted))
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
            detail=repr(exc)[:300],
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
        fail_only=fail_only,
        suite_ran=fail_only and suite_ran(from_first_start(log, start), meta.get("suite_ran")),
    )


def suite_ran(log: str, pattern) -> bool:
    """Evidence that the runner executed tests: the harness's own pattern (swebench 5.x ``SUITE_RAN``)."""
    return bool(pattern) and re.search(pattern, log, re.M) is not None


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
        result = failed_grade(
            "parser_exception", [], [], eval_returncode=eval_rc, log_tail=repr(exc), detail=repr(exc)[:300]
        )
    sys.stdout.write(marker_line(result, args["--marker"]) + "\n")
    sys.stdout.flush()
    return 0
