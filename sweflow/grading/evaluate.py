"""Fresh-sandbox evaluation: take the agent's patch out of its sandbox, grade it in a new one, get a reward.

``evaluate_patch`` checks the patch against the integrity rules, applies it to a NEW sandbox of the row's
template (``sweflow.grading.fresh``), runs the row's eval script there and grades the log on the host with the
harness package's parser; no sandbox is trusted for grading. ``agent_eval`` retries it for an agent's patch.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import EvalError
from ..harness import driver
from ..harness.grader import (
    HOST_SCRIPT,
    HostGrader,
    host_eval_command,
    host_eval_script,
    row_eval_script,
    sealed,
)
from ..sandbox.base import Provider, Sandbox
from ..sandbox.logged import TRUNCATED_NOTE
from ..sandbox.settings import NetworkSettings
from . import canary, canary_place, fresh
from .evidence import evidence_record, read_evidence, write_evidence
from .integrity import DEFAULT_RULES, IntegrityRules
from .patch import PatchResult, check_patch, extract_patch
from .patch_integrity import (
    PROHIBITED_TEST_INFRASTRUCTURE,
    PROHIBITED_TEST_MODIFICATION,
    SUSPICIOUS_TEST_TAMPERING,
    PatchViolation,
    check_patch_integrity,
    patch_paths,
)
from .reasons import (
    EMPTY_GENERATION,
    EVAL_NOT_RUN,
    FAILED_APPLY_PATCH,
    FRESH_EVAL_EXCEPTION,
    FRESH_EVAL_TIMEOUT,
    INFRA_REASONS,
    LOG_TRUNCATED,
    PATCH_DEFEATED_EVALUATION,
    PATCH_EXTRACTION_FAILED,
    PATCH_UNEXTRACTABLE,
    SANDBOX_LOST,
)

log = logging.getLogger("sweflow.grading.evaluate")
_decode = fresh.decode

# Network: a fresh sandbox is offline unless ``network`` says otherwise (``eval_network`` reads the
# ``sandbox.network`` config: ``eval`` with per-repository ``eval_repos`` overrides); the agent's sandbox
# never takes this setting. The networks a fresh evaluation may get: offline, or the provider's outbound one.
NETWORK_MODES = ("none", "internet")

OUTPUT_TAIL_CHARS = 4000
SETUP_TIMEOUT = 300.0
# Time allowed beyond the evaluator's own timeout before the fresh evaluation is abandoned.
DEADLINE_GRACE = 120.0
# The eval script's own `timeout` when the row's evaluator step does not say (the recipe's 1200 s).
EVAL_TIMEOUT = 1200
__all__ = [
    "EMPTY_GENERATION",
    "INFRA_REASONS",
    "PATCH_DEFEATED_EVALUATION",
    "PROHIBITED_TEST_INFRASTRUCTURE",
    "PROHIBITED_TEST_MODIFICATION",
    "SUSPICIOUS_TEST_TAMPERING",
    "EvalResult",
    "PatchResult",
    "check_patch",
    "eval_network",
    "evaluate_patch",
    "extract_patch",
    "patch_paths",
    # moved to .evidence, .patch and .reasons; still importable from here
    "PATCH_EXTRACTION_FAILED",
    "PATCH_UNEXTRACTABLE",
    "evidence_record",
    "read_evidence",
    "write_evidence",
]


# ----- fresh evaluation ---------------------------------------------------------------------------------
# Typical use (the rollout dispatcher, through ``agent_eval.evaluate_agent_patch``)::
#
#     got = extract_patch(agent_sandbox, meta["base_commit"])
#     if got.failure_reason:                       # empty_generation / prohibited_test_modification / ...
#         reward = 0.0
#     else:
#         res = evaluate_patch(provider, meta["sandbox_image"], meta, got.patch)
#         reward = res.reward                      # 1.0 only when the host-side grade says resolved
#
# Infrastructure failures are not grades. ``EvalResult.infra`` is True (and ``error`` says why) when the
# evaluation could not run: a provider fault (fresh_eval_exception), the provider's deadline passed
# (fresh_eval_timeout: the in-sandbox ``timeout`` should have ended the script long before), the sandbox or
# the eval process was killed from outside (sandbox_lost), or the log of a trusted patch (validation's gold
# and empty) lacks the harness's start marker while the script ended on its own (eval_not_run: it never
# reached the test command). Callers retry or abort; they never give reward 0 for these (for an agent's
# patch, see ``agent_eval``). The test command running past its own ``timeout`` (exit 124/137 from the eval
# script, the sandbox alive) is a grade: ``eval_timeout``, not resolved, as upstream.
@dataclass
class EvalResult:
    """The verdict of one fresh evaluation.

    ``reward`` is 1.0 only if the host-side grade says resolved. ``failure_reason``: None when resolved,
    else a harness reason (fail_to_pass_failure, log_contradicts_exit_code, duplicate_status_lines, ...),
    a patch-integrity reason (prohibited_test_infrastructure, suspicious_test_tampering, ...) or an
    evaluation reason (failed_apply_patch, log_truncated, or one of ``INFRA_REASONS``). ``marker`` is the
    grade (the same fields the in-sandbox evaluator prints after its marker), ``output_tail`` the bounded
    end of the evaluation log, ``timings`` seconds per phase, ``error`` why the evaluation could not run
    (set exactly for the infrastructure reasons), ``violations`` the refused changes when the patch broke
    an integrity rule. ``log`` is the whole host-side log (``to_dict`` leaves it out), ``statuses`` the
    status map the harness parser read from it, ``exit_code`` the provider's record of the eval command.
    ``canaries`` are the planted canaries with their outcomes, ``canary_family`` the runner family they
    were drawn for (None when none were drawn).
    """

    reward: float
    resolved: bool
    failure_reason: str | None
    marker: dict | None = None
    output_tail: str = ""
    timings: dict = field(default_factory=dict)
    error: str | None = None
    violations: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    exit_code: int | None = None
    log: str = field(default="", repr=False)
    canaries: list = field(default_factory=list)
    # the runner family canaries were drawn for (pytest, django, sympy); None: none were drawn (canaries
    # off, or a runner that cannot carry them). Set with ``canaries`` empty: the row yielded none to plant.
    canary_family: str | None = None

    @property
    def infra(self) -> bool:
        """True when the evaluation did not happen (a provider or sandbox failure), so no grade exists."""
        return self.failure_reason in INFRA_REASONS

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("log")
        return out


def eval_network(network: NetworkSettings | None, repo: str) -> str:
    """The network of a fresh evaluation of a row of ``repo``: ``eval_repos[repo]``, else ``eval``; no
    settings: "none". Repository names match case-insensitively (the harness forks differ in case)."""
    if network is None:
        return "none"
    repos = {str(k).lower(): v for k, v in network.eval_repos.items()}
    mode = str(repos.get(repo.lower(), network.eval))
    if mode not in NETWORK_MODES:
        raise EvalError(
            f"unknown evaluation network {mode!r} (expected one of {', '.join(NETWORK_MODES)})",
            field="sandbox.network",
            row=repo or None,
        )
    return mode


def evaluator_step(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The after-agent ``harness_eval`` command entry of a training row's metadata (the first if unnamed)."""
    steps = list((metadata.get("blackbox_execute_cmds") or {}).get("after_agent") or [])
    named = [s for s in steps if s.get("name") == "harness_eval"]
    step = (named or steps or [None])[0]
    if not step or not step.get("cmd"):
        raise EvalError(
            "row has no after-agent evaluator command",
            row=metadata.get("instance_id"),
            field="blackbox_execute_cmds.after_agent",
        )
    return step


def _bounded(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    return text if len(text) <= limit else text[-limit:]


def _result(
    reason: str,
    timings: dict,
    *,
    tail: str = "",
    error: str | None = None,
    log: str = "",
    rc: int | None = None,
) -> EvalResult:
    return EvalResult(0.0, False, reason, None, _bounded(tail), timings, error, log=log, exit_code=rc)


def _refused(found: list, timings: dict) -> EvalResult:
    """Reward 0 for a patch that broke an integrity rule: the first rule's reason, every violation kept."""
    res = _result(found[0].reason, timings, tail="refused: " + "; ".join(v.detail for v in found[:5]))
    res.violations = [v.to_dict() for v in found]
    return res


def _read_log(path: str) -> str:
    with open(path, "rb") as fh:
        return _decode(fh.read())


def evaluate_patch(
    provider: Provider,
    template: str,
    metadata: dict,
    patch: str,
    *,
    deadline: float | None = None,
    sandbox_timeout: float = 3600,
    env: dict | None = None,
    grader: HostGrader | None = None,
    rules: IntegrityRules = DEFAULT_RULES,
    network: str | None = None,
    trusted_patch: bool = False,
    canaries: bool = True,
    rng: Any = None,
    decoy: bool = False,
) -> EvalResult:
    """Apply ``patch`` in a fresh sandbox of ``template``, run the official eval script, grade on the host.

    The official eval script's output is piped to the host by the provider (``Sandbox.run_logged``); the
    exit status is the provider's record of the test command, and the log is graded HERE
    (``sweflow.harness.grader``). Nothing the tested code prints is read as a verdict: a forged PASSED line
    meets the cross-checks (exit status vs statuses, contradictory and duplicated status lines). The row's
    in-sandbox evaluator command (with its reward marker) stays in the training JSONL for other trainers;
    it trusts the sandbox.

    Steps: the patch-integrity check (``check_patch`` with the row's tests and eval script: a refused patch
    never reaches a sandbox); create; ``git reset --hard <base> && git clean -fd``; ``git apply --binary``
    (skipped for an empty patch, which grades the base itself); run the row's eval script through
    ``Sandbox.run_logged`` (its log comes back through the provider's pipe, its exit status is the
    provider's record of the test command); grade the log here with the harness package's parser
    (``grader``, default ``HostGrader.for_metadata``). Nothing the sandbox prints is taken as a verdict.
    ``rules`` are the integrity rules of the patch check. ``network`` ("none" or "internet", see
    ``eval_network``) goes to ``provider.create``; None leaves the provider's default (offline).
    ``trusted_patch`` (validation's gold and empty patches): a log without the start marker is then
    eval_not_run (infrastructure); for an agent's patch it is graded, since code the patch brings may run
    before the tests (a reinstall) and validation showed that the script reaches them without it.
    ``deadline`` is an absolute ``time.monotonic()`` instant (default: now + the evaluator step's timeout
    + 120 s); past it the result is fresh_eval_timeout. The sandbox is always killed. A row without an
    evaluator command raises EvalError (a caller bug, not a rollout outcome). Infrastructure failures
    come back with ``infra`` True (see the comment above `EvalResult`).

    ``canaries`` (default on): for a pytest-family row the host appends canary tests of its own to a test
    file the command runs, just before the test output starts (``sweflow.grading.canary``); a canary with
    the wrong outcome is runner_tampered, and a resolved pytest log without pytest's closing summary is
    runner_not_finished. ``rng`` draws the canaries (default ``random.SystemRandom``; tests pass a seed).
    ``decoy``: a decoy run (``agent_eval``): each FAIL_TO_PASS test that gets twins is itself run with its
    expected literal moved, so every test of its cluster must fail; one reported passing is runner_tampered.
    """
    step = evaluator_step(metadata)
    workdir = metadata.get("workdir") or "/testbed"
    base = metadata["base_commit"]
    t0 = time.monotonic()
    step_timeout = float(step.get("timeout") or EVAL_TIMEOUT + 60)
    if deadline is None:
        deadline = t0 + step_timeout + DEADLINE_GRACE
    script = row_eval_script(metadata, step["cmd"])
    timings: dict[str, float] = {}
    found = (
        check_patch_integrity(patch, metadata=metadata, eval_script=script, rules=rules)
        if patch.strip()
        else []
    )
    if found:
        return _refused(found, timings)
    host_script = host_eval_script(script, instance_id=metadata.get("instance_id"))
    eval_timeout = int(min(EVAL_TIMEOUT, max(1.0, step_timeout - 60)))
    sb: Sandbox | None = None
    log_dir = tempfile.mkdtemp(prefix="sweflow-eval-")
    log_path = os.path.join(log_dir, "eval.log")
    try:
        grader = grader or HostGrader.for_metadata(metadata)
        start = getattr(getattr(grader, "harness", None), "start_marker", None)
        end = getattr(getattr(grader, "harness", None), "end_marker", None)
        family = canary.family_of(grader.parser_for(metadata))
        pytest_row = family == canary.PYTEST
        test_command = _test_command(script, start, end)
        rng = rng or random.SystemRandom()
        # the files canaries may come from: read at the base by the same command that resets the tree
        sources = (
            fresh.canary_files(
                list(metadata.get("PASS_TO_PASS") or []),
                test_command,
                rng=rng,
                family=family,
                fail_to_pass=list(metadata.get("FAIL_TO_PASS") or []),
            )
            if canaries and family
            else []
        )
        sb = provider.create(
            template,
            timeout=sandbox_timeout,
            env=env,
            metadata={"purpose": "fresh_eval", "instance_id": str(metadata.get("instance_id", ""))},
            **({"network": network} if network is not None else {}),
        )
        timings["create_s"] = round(time.monotonic() - t0, 3)
        t1 = time.monotonic()
        failed, at_base = fresh.prepare_reading(sb, workdir, base, patch, sources)
        if failed is not None:
            timings["setup_s"] = round(time.monotonic() - t1, 3)
            return _result(FAILED_APPLY_PATCH, timings, tail=failed)
        if patch.strip():
            # What the patch really did to the tree, as text, by this sandbox's clean git: binary
            # attributes, diff drivers or odd headers in the agent's diff cannot hide a change here.
            shown = fresh.applied_diff(sb, workdir, base, rules)
            found = (
                [shown]
                if isinstance(shown, PatchViolation)
                else check_patch_integrity(shown, metadata=metadata, eval_script=script, rules=rules)
            )
            if found:
                timings["setup_s"] = round(time.monotonic() - t1, 3)
                return _refused(found, timings)
        planted = canary.CanarySet()
        if canaries and family:
            tc = time.monotonic()
            planted = fresh.draw_canaries(
                sb,
                workdir,
                base,
                list(metadata.get("PASS_TO_PASS") or []),
                test_command,
                test_patch=canary_place.test_patch_of(script),
                rng=rng,
                family=family,
                reserved=_test_names(metadata),
                fail_to_pass=list(metadata.get("FAIL_TO_PASS") or []),
                at_base=at_base,
                decoy=decoy,
            )
            host_script = canary_place.inject(host_script, planted, start)
            timings["canary_s"] = round(time.monotonic() - tc, 3)
        sb.write_file(HOST_SCRIPT, sealed(host_script, start, instance_id=metadata.get("instance_id")))
        timings["setup_s"] = round(time.monotonic() - t1, 3)
        t2 = time.monotonic()
        left = deadline - time.monotonic()
        if left <= 0:
            return _result(FRESH_EVAL_TIMEOUT, timings, error="the fresh-eval deadline passed before the run")
        res = sb.run_logged(host_eval_command(eval_timeout), log_path, timeout=left, cwd=workdir)
        timings["eval_s"] = round(time.monotonic() - t2, 3)
        log_text = canary.original_names(_read_log(log_path) if os.path.exists(log_path) else "", planted)
        rc = res.exit_code
        if res.timed_out:
            return _result(
                FRESH_EVAL_TIMEOUT,
                timings,
                tail=log_text,
                log=log_text,
                rc=rc,
                error="the evaluator passed the fresh-eval deadline",
            )
        lost = _infra_failure(sb, rc, log_text, start, trusted=trusted_patch)
        if lost is not None:
            reason, why = lost
            log.warning("fresh evaluation of %s: %s: %s", metadata.get("instance_id"), reason, why)
            return _result(reason, timings, tail=log_text, log=log_text, rc=rc, error=why)
        if log_text.endswith(TRUNCATED_NOTE.decode()):
            # The end of the log (the runner's summary, its FAILED lines) is gone: nothing to grade.
            return _result(LOG_TRUNCATED, timings, tail=log_text, log=log_text, rc=rc)
        g = grader.grade(log_text, metadata, rc)
        statuses = _statuses(grader, log_text, metadata)
        verdicts = [{**c.to_dict(), "got": c.status_in(statuses)} for c in planted]
        # A canary that is wrong or missing overrides a pass; for an agent's patch a must-fail canary
        # reported passing overrides any grade, so the tampering is named. A trusted patch's failed run
        # keeps its own reason: a clone of a flaky test can pass by chance (`assert x != 0` of one that
        # failed), and the run failed anyway; but in a decoy run (never resolved: every FAIL_TO_PASS test
        # carries a moved literal) a twin or stand-in passing is named for a trusted patch too: validation's
        # gold patch no-oping a guessed original.
        runner = canary.check_canaries(planted, statuses, rc)
        suspects = planted if not trusted_patch else [c for c in planted if decoy and c.of == canary.F2P]
        named = canary.forged_pass(suspects, statuses, twins=decoy)
        if runner is not None and not (g.resolved or named):
            runner = None
        if runner is None and g.resolved and pytest_row:
            if canary.summary_expected(test_command):
                runner = canary.runner_finished(driver.test_section(log_text, start, end) or log_text)
        if runner is not None:
            g.resolved = False
            g.failure_reason = runner.split(":", 1)[0]
            g.failure_detail = runner
        payload = g.to_marker_dict()
        reward = 1.0 if g.resolved else 0.0
        return EvalResult(
            reward,
            g.resolved,
            g.failure_reason,
            payload,
            _bounded(log_text),
            timings,
            None,
            statuses=canary.without(statuses, planted),
            exit_code=rc,
            log=log_text,
            canaries=verdicts,
            canary_family=family if canaries and family else None,
        )
    except Exception as exc:  # noqa: BLE001 - every fault becomes a graded outcome for the dispatcher
        log.warning(
            "fresh evaluation of %s failed: %s: %s", metadata.get("instance_id"), type(exc).__name__, exc
        )
        return _result(FRESH_EVAL_EXCEPTION, timings, error=f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        if sb is not None:
            t3 = time.monotonic()
            try:
                sb.kill()
            except Exception as exc:  # noqa: BLE001 - the verdict stands; the leak is logged
                log.warning("killing sandbox %s failed: %s", getattr(sb, "id", "?"), exc)
            timings["kill_s"] = round(time.monotonic() - t3, 3)
        timings["total_s"] = round(time.monotonic() - t0, 3)


_alive = fresh.alive


def _infra_failure(
    sb: Sandbox, rc: int, log_text: str, start: str | None, *, trusted: bool
) -> tuple[str, str] | None:
    """(reason, why) when the eval script did not run to its own end inside a live sandbox, else None.

    A negative exit status is a signal from outside the sandbox's command (the provider's process was
    killed); a killed sandbox is gone. When the log lacks the harness's start marker, or the status is
    137 (SIGKILL: the eval's own ``timeout -k``, or a kill from outside), the sandbox is probed: dead
    means sandbox_lost; alive without a start marker (and a ``trusted`` patch) means the script never
    reached the test command.
    """
    if getattr(sb, "killed", False):
        return SANDBOX_LOST, f"the sandbox was killed during the evaluation (exit {rc})"
    if rc < 0:
        return SANDBOX_LOST, f"the evaluation process was killed from outside (signal {-rc})"
    no_start = bool(start) and start not in log_text
    if no_start or rc == 137:
        if not _alive(sb):
            return SANDBOX_LOST, f"the sandbox died during the evaluation (exit {rc})"
        if trusted and no_start and rc not in driver.TIMEOUT_RETURNCODES:
            return EVAL_NOT_RUN, (
                f"the eval script ended (exit {rc}) without reaching the test command "
                f"(no {start!r} in the {len(log_text)}-character log)"
            )
    return None


def _test_names(metadata: Mapping[str, Any]) -> list[str]:
    """Every name the row's tests go by (last part of each id): no canary may take one."""
    ids = list(metadata.get("FAIL_TO_PASS") or []) + list(metadata.get("PASS_TO_PASS") or [])
    return sorted({str(t).split(" (")[0].split("::")[-1].split("[")[0] for t in ids})


def _test_command(script: str, start: str | None, end: str | None) -> str:
    """The eval script's lines between its start and end markers (the test command)."""
    return driver.test_section(script, start, end) if start and end else ""


def _statuses(grader: HostGrader, log_text: str, metadata: Mapping[str, Any]) -> dict[str, str]:
    """The harness parser's status map of the log (what the grade was computed from); {} if it fails."""
    h = getattr(grader, "harness", None)
    parser = grader.parser_for(metadata) if h is not None else None
    if parser is None:
        return {}
    spec = driver._Spec(
        {
            "instance_id": metadata.get("instance_id", ""),
            "repo": metadata.get("repo", ""),
            "version": str(metadata.get("version", "")),
            "FAIL_TO_PASS": list(metadata.get("FAIL_TO_PASS") or []),
            "PASS_TO_PASS": list(metadata.get("PASS_TO_PASS") or []),
        }
    )
    try:
        return {
            str(k): str(v)
            for k, v in driver.parse_statuses(parser, log_text, spec, h.start_marker, h.end_marker).items()
        }
    except Exception:  # noqa: BLE001 - the grade already records a parser failure
        return {}
