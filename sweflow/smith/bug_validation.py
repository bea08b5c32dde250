"""Before/after validation: the reference suite run and each candidate's bug run, k times each, graded here.

Each run: a fresh sandbox of the repository's environment template, the candidate's diff applied by the
trusted step (``sweflow.grading.fresh``), the host's canaries planted, the whole suite `runs` times; the log
is parsed HERE with the installed harness package's parser, nothing the sandbox writes is a verdict.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SandboxError, SmithError
from ..grading import canary, fresh
from ..grading.pass_rules import passes
from ..harness import driver
from ..sandbox.base import TIMEOUT_EXITS, Provider
from ..schema import default
from ..util import retry
from .candidates import Candidate
from .profile import RepoProfile

log = logging.getLogger("sweflow.smith.validate")  # its name from before the module was renamed

ABSENT = "ABSENT"
RULE = "swesmith"  # the pass rule of SWE-smith's own validation (grading.pass_rules)
WORKDIR = "/testbed"
SETUP_TIMEOUT = 300.0
# Outcomes of one candidate.
KEPT = "kept"
NO_F2P = "no_fail_to_pass"
NO_P2P = "no_pass_to_pass"
TIMEOUT = "timeout"
NO_TESTS = "no_tests_in_log"
APPLY_FAILED = "apply_failed"
RUNNER_TAMPERED = "runner_tampered"
ERROR = "error"
TAIL_CHARS = 3000


@dataclass
class SuiteRun:
    """One run of the whole suite: the parsed status map, the provider's exit status, timing."""

    statuses: dict[str, str]
    exit_code: int | None
    timed_out: bool
    seconds: float
    tail: str = field(default="", repr=False)
    runner: str | None = None  # why the host's canaries say the run was tampered with, or None
    canaries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuiteResult:
    """All runs of one sandbox; `apply_error` is set (and `runs` empty) when the diff did not apply."""

    runs: list[SuiteRun]
    apply_error: str | None = None
    statement_tail: str | None = None  # the canary-free run's output tail (``run_suite(statement_run=True)``)

    @property
    def timed_out(self) -> bool:
        return any(r.timed_out for r in self.runs)


def suite_command(profile: RepoProfile, timeout: int) -> str:
    """The test run: the image's environment, then the profile's test command under `timeout` (KILL)."""
    pre = f"{profile.pre_test} && " if profile.pre_test else ""
    return f"{pre}cd /testbed && timeout -s KILL {int(timeout)} bash -c {shlex.quote(profile.test_cmd)}"


# A run happens in a fresh sandbox of the repository's environment template (the repository at /testbed at the
# reference commit): reset, apply the candidate's diff (``sweflow.grading.fresh``, the step grading uses too),
# plant the host's canaries, then the whole suite `runs` times, each under its own `timeout`, with the tree
# reset, the diff re-applied and new canaries drawn before every run (files outside /testbed, like /tmp,
# carry over, so a test that depends on an earlier run's leftovers shows up as unstable). The log comes back
# through the provider's pipe. A sandbox that cannot be created or dies is an infrastructure error, never a
# verdict: it is retried, then reported.
def run_suite(
    provider: Provider,
    template: str,
    profile: RepoProfile,
    commit: str,
    *,
    parser: Callable[..., Any],
    patch: str = "",
    runs: int = default("smith.validation.runs"),
    timeout: int | None = None,
    canary_from: Sequence[str] = (),
    rng: random.Random | None = None,
    statement_run: bool = False,
) -> SuiteResult:
    """Apply `patch` at `commit` in one fresh sandbox and run the suite `runs` times; raises SandboxError
    when the sandbox fails (an infrastructure fault, for the caller to retry).

    ``canary_from`` (the reference's stable passing tests; pytest-family parsers only): before each run the
    host plants must-fail canaries cloned from them (``sweflow.grading.fresh``), drawn anew per run; a run
    whose canaries are not all reported failing records why in ``SuiteRun.runner`` and the canaries never
    enter its statuses. ``statement_run`` (with canaries): one more run, without them, whose output tail
    (``SuiteResult.statement_tail``) problem statements are written from; its statuses count for nothing."""
    if runs < 1:
        raise SmithError("runs must be at least 1", field="validation.runs")
    timeout = int(timeout or profile.timeout_sec)
    cmd = suite_command(profile, timeout)
    with_canaries = bool(canary_from) and canary.is_pytest_parser(parser)
    out: list[SuiteRun] = []
    statement_tail: str | None = None
    # without canaries the verdict's last run is canary-free already: no extra run
    total = runs + (1 if statement_run and with_canaries else 0)
    sb = provider.create(
        template,
        timeout=SETUP_TIMEOUT + total * (timeout + 120),
        metadata={"purpose": "smith_validation", "repo": profile.repo},
    )
    try:
        if profile.install:
            r = sb.run(f"cd /testbed && {' && '.join(profile.install)}", timeout=SETUP_TIMEOUT)
            if not r.ok:
                raise SandboxError(f"install commands failed (exit {r.exit_code})", file=template)
        with tempfile.TemporaryDirectory(prefix="sweflow-smith-") as tmp:
            for i in range(total):
                extra = i == runs  # the canary-free run the problem statement is written from
                failed = fresh.prepare(sb, WORKDIR, commit, patch)
                if failed is not None:
                    if extra:
                        break
                    return SuiteResult([], failed[-500:])
                planted = canary.CanarySet()
                if with_canaries and not extra:
                    # must-fail only, no `!=`: the bug may break (or change) what a clone tests
                    planted = fresh.draw_canaries(
                        sb, WORKDIR, commit, canary_from, profile.test_cmd, rng=rng, must_pass=0, negate=False
                    )
                    fresh.plant_canaries(sb, WORKDIR, planted)
                path = os.path.join(tmp, f"run-{i}.log")
                t0 = time.monotonic()
                res = sb.run_logged(cmd, path, timeout=timeout + 60)
                text = open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
                killed = res.timed_out or res.exit_code in TIMEOUT_EXITS
                if extra:
                    statement_tail = None if killed else text[-TAIL_CHARS:]
                    break
                statuses = {} if killed else driver.call_parser(parser, text, None)
                runner = (
                    None
                    if killed
                    else canary.check_canaries(planted, statuses, res.exit_code, absent_with_file=True)
                )
                out.append(
                    SuiteRun(
                        canary.without(statuses, planted),
                        res.exit_code,
                        killed,
                        round(time.monotonic() - t0, 3),
                        canary.scrub_output(text, planted)[-TAIL_CHARS:],
                        runner=runner,
                        canaries=len(planted),
                    )
                )
                if killed:
                    break
    finally:
        try:
            sb.kill()
        except Exception as exc:  # noqa: BLE001 - the result stands; the leak is logged
            log.warning("killing sandbox %s failed: %s", getattr(sb, "id", "?"), exc)
    return SuiteResult(out, statement_tail=statement_tail)


def reference_run(
    provider: Provider,
    template: str,
    profile: RepoProfile,
    commit: str,
    *,
    parser: Callable[..., Any],
    runs: int = default("smith.validation.runs"),
    attempts: int = default("smith.validation.attempts"),
) -> SuiteResult:
    """The reference: the whole suite `runs` times at `commit` (reference timeout), retried on a sandbox
    fault."""
    return retry(
        lambda: run_suite(
            provider,
            template,
            profile,
            commit,
            parser=parser,
            runs=runs,
            timeout=profile.reference_timeout_sec,
        ),
        attempts=attempts,
        backoff=1.0,
        what=f"reference run of {profile.repo}",
    )


# SWE-smith's pass rule (grading.pass_rules "swesmith"): only PASSED is a pass. A test
# is stable when its status is the same in every run. FAIL_TO_PASS: stable PASSED in the reference and stable
# non-pass with the bug; PASS_TO_PASS: stable PASSED in both; everything else (flaky in either) is left out and
# counted. A suite run past its timeout makes the candidate `timeout` (skipped, as upstream).
def stable_statuses(runs: Sequence[Mapping[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Tests whose status is the same in every run (absent counts as a status), and the unstable ones."""
    names = sorted(set().union(*[set(r) for r in runs])) if runs else []
    stable, flaky = {}, []
    for name in names:
        seen = {r.get(name, ABSENT) for r in runs}
        if len(seen) == 1:
            stable[name] = seen.pop()
        else:
            flaky.append(name)
    return stable, flaky


def reference_verdict(result: SuiteResult, profile: RepoProfile) -> dict[str, Any]:
    """Is the reference usable? The parser found tests, none timed out, and the stable passing share is at
    least `min_pass_share`. Returns {ok, reason, passed (stable PASSED tests), flaky, tests, share}."""
    runs = [r.statuses for r in result.runs]
    stable, flaky = stable_statuses(runs)
    passed = sorted(t for t, s in stable.items() if passes(RULE, s))
    total = len(set().union(*[set(r) for r in runs])) if runs else 0
    share = len(passed) / total if total else 0.0
    reason = None
    if result.apply_error:
        reason = result.apply_error
    elif result.timed_out:
        reason = f"the reference run passed its timeout ({profile.reference_timeout_sec} s)"
    elif total == 0:
        reason = f"the parser {profile.log_parser} found no tests in the reference log"
    elif share < profile.min_pass_share:
        reason = f"only {share:.0%} of {total} tests pass (need {profile.min_pass_share:.0%})"
    return {
        "ok": reason is None,
        "reason": reason,
        "tests": total,
        "passed": passed,
        "flaky": flaky,
        "share": round(share, 4),
    }


def classify(reference_passed: Sequence[str], bug_runs: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
    """F2P / P2P over the reference's stable passes; tests unstable under the bug go to `flaky`."""
    f2p, p2p, flaky = [], [], []
    for test in sorted(reference_passed):
        seen = {r.get(test, ABSENT) for r in bug_runs}
        if len(seen) > 1:
            flaky.append(test)
        elif len(seen) == 1 and passes(RULE, next(iter(seen))):
            p2p.append(test)
        else:
            f2p.append(test)
    return {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "flaky": flaky}


def validate_candidate(
    provider: Provider,
    template: str,
    profile: RepoProfile,
    commit: str,
    cand: Candidate,
    reference: Mapping[str, Any],
    *,
    parser: Callable[..., Any],
    runs: int = default("smith.validation.runs"),
    attempts: int = default("smith.validation.attempts"),
    require_p2p: bool = True,
    canaries: bool = True,
) -> dict[str, Any]:
    """The report of one candidate: status (kept / no_fail_to_pass / no_pass_to_pass / timeout /
    apply_failed / runner_tampered / no_tests_in_log / error), F2P, P2P, flaky tests, per-run exit codes,
    seconds and canary counts, the failing output tail. ``canaries``: plant the host's canaries in each bug
    run (see ``run_suite``)."""
    base = {"instance_id": cand.instance_id, "strategy": cand.strategy, "files": list(cand.files)}
    t0 = time.monotonic()
    try:
        res = retry(
            lambda: run_suite(
                provider,
                template,
                profile,
                commit,
                parser=parser,
                patch=cand.patch,
                runs=runs,
                canary_from=reference["passed"] if canaries else (),
                statement_run=canaries,
            ),
            attempts=attempts,
            backoff=1.0,
            what=f"validation of {cand.instance_id}",
        )
    except Exception as exc:  # noqa: BLE001 - an infrastructure fault is reported, never a verdict
        return {**base, "status": ERROR, "error": f"{type(exc).__name__}: {exc}"[:500], "seconds": _since(t0)}
    runs_info = [
        {"exit_code": r.exit_code, "seconds": r.seconds, "timed_out": r.timed_out, "canaries": r.canaries}
        for r in res.runs
    ]
    if res.apply_error:
        return {**base, "status": APPLY_FAILED, "error": res.apply_error, "seconds": _since(t0)}
    if res.timed_out:
        return {**base, "status": TIMEOUT, "runs": runs_info, "seconds": _since(t0)}
    tampered = next((r.runner for r in res.runs if r.runner), None)
    if tampered:
        # the candidate's code made the host's must-fail canaries pass (or vanish): its statuses say nothing
        return {
            **base,
            "status": RUNNER_TAMPERED,
            "error": tampered[:500],
            "runs": runs_info,
            "seconds": _since(t0),
        }
    known = set(reference["passed"])
    if any(not known & set(r.statuses) for r in res.runs):
        # none of the reference's tests in a log (pytest aborted at collection, the environment broke):
        # every test would look failing, and a task hiding every test file teaches nothing; dropped
        return {**base, "status": NO_TESTS, "runs": runs_info, "seconds": _since(t0)}
    split = classify(reference["passed"], [r.statuses for r in res.runs])
    if not split["FAIL_TO_PASS"]:
        status = NO_F2P
    elif require_p2p and not split["PASS_TO_PASS"]:
        status = NO_P2P
    else:
        status = KEPT
    report = {**base, "status": status, **split, "runs": runs_info, "seconds": _since(t0)}
    if status == KEPT:
        # from the canary-free run: the canaries, drawn anew every run, change which errors a log shows
        tail = res.statement_tail if res.statement_tail is not None else res.runs[-1].tail
        report["failing_output"] = _untimed(tail)
    return report


_DURATION_RE = re.compile(r"^(=+ .*\bin )\d+(?:\.\d+)?s( \(\d+:\d+:\d+\))?( =+)$", re.M)


def _untimed(text: str) -> str:
    """The output without the runner's own duration (pytest's summary line), so that the same failure gives
    the same text, and the same problem statement, on every run."""
    return _DURATION_RE.sub(r"\1<duration>\3", text)


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)
