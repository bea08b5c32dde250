"""Task validation: every training task must be solvable by its gold patch and not by doing nothing.

Per task, in fresh sandboxes exactly as a rollout is graded (``sweflow.grading.evaluate``): the gold patch must
resolve, the empty patch must not, each ``repeats`` times so flaky tests show up; the verdict is one of
``VERDICTS``. Every evaluation (retries included) leaves its evidence in the caller's ``evidence`` list.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from ..sandbox.base import Provider
from ..schema import default
from .evaluate import EvalResult, evaluate_patch
from .evidence import evidence_record
from .patch import check_patch
from .reasons import INFRA_REASONS, RUNNER_TAMPERED

log = logging.getLogger("sweflow.validation")

# The verdicts:
# - ``valid``: gold resolved every time, empty never;
# - ``gold_fails``: gold never resolved (or is not a gradable patch: it edits tests, or is empty);
# - ``empty_passes``: the unchanged repository already resolves every time;
# - ``flaky``: gold or empty got different outcomes across repeats;
# - ``unguarded``: valid, but some gold run planted no canary although the row's runner carries them (its
#   tests yield none to clone: fixtures, parametrized ids, no ``==`` check), so a patch that makes every test
#   "pass" would be paid on it; reported, and left out of ``tasks.valid.jsonl`` unless
#   ``validation.allow_unguarded``;
# - ``error``: the infrastructure failed (a provider fault, a dead or killed sandbox, the provider's
#   deadline, an eval script that never reached the tests; see ``sweflow.grading.evaluate``) on every one of
#   ``error_attempts`` tries of some run, so nothing can be concluded about the task.
# An infrastructure failure is retried (``validation.error_attempts``, exponential backoff from
# ``validation.error_backoff_sec``); it is never a verdict about the task. An ``error`` task is reported
# under ``errors`` in the summary (not under ``broken``), kept out of ``tasks.valid.jsonl``, and is not
# final: the validate stage's summary removes its result (and record) and the workflow dates the summary
# back after the run, so the next run validates it again.
# The test command timing out inside a live sandbox (``eval_timeout``) is a run outcome like any failing
# test: gold timing out every time is ``gold_fails``, sometimes ``flaky``.
# Every evaluation's evidence: the whole host-side log and the parsed status map, appended to the caller's
# ``evidence`` list (``sweflow.stages.validate`` writes it next to the verdict).
VERDICTS = ("valid", "gold_fails", "empty_passes", "flaky", "unguarded", "error")
UNGUARDED = "unguarded"
ERROR_ATTEMPTS = default("validation.error_attempts")
ERROR_BACKOFF_S = float(default("validation.error_backoff_sec"))
_MARKER_KEYS = (
    "fail_to_pass_success",
    "fail_to_pass_total",
    "pass_to_pass_success",
    "pass_to_pass_total",
    "parsed_tests",
    "test_exit_code",
    "eval_returncode",
    "failed_tests",
    "failure_detail",
)


def run_record(kind: str, index: int, res: EvalResult, infra_errors: list | None = None) -> dict[str, Any]:
    """The per-run entry of a task's validation file (marker counts, not the log tail); ``infra_errors``
    are the failed tries before this outcome ("reason: error" each)."""
    marker = res.marker or {}
    return {
        "patch": kind,
        "run": index,
        "attempts": len(infra_errors or []) + 1,
        "infra_errors": list(infra_errors or []),
        "resolved": res.resolved,
        "reward": res.reward,
        "failure_reason": res.failure_reason,
        "error": res.error,
        "marker": {k: marker[k] for k in _MARKER_KEYS if k in marker},
        "timings": dict(res.timings),
        "canaries": len(res.canaries),
        # twins of FAIL_TO_PASS tests: without any, a forger that no-ops every new test lacking a near-copy
        # is paid whatever the other canaries say (the row is only guarded against cruder forgers)
        "f2p_twins": sum(c.get("of") == "f2p" and c.get("expect") == "fail" for c in res.canaries),
        "canary_family": res.canary_family,
        "output_tail": res.output_tail[-1500:] if not res.resolved and res.output_tail else "",
    }


def decide(
    gold: list[dict[str, Any]], empty: list[dict[str, Any]], pre_reason: str | None = None
) -> tuple[str, str | None]:
    """(verdict, reason) from the gold and empty run records (see the verdicts above `VERDICTS`)."""
    if pre_reason:
        return "gold_fails", pre_reason
    infra = [r for r in gold + empty if r["failure_reason"] in INFRA_REASONS]
    if infra:
        r = infra[0]
        tries = r.get("attempts", 1)
        where = f"{r['patch']} run {r['run']}" + (f", {tries} tries" if tries > 1 else "")
        return "error", f"{r['failure_reason']} ({where}): {r.get('error') or ''}".strip()
    g = sum(r["resolved"] for r in gold)
    e = sum(r["resolved"] for r in empty)
    if 0 < g < len(gold):
        return "flaky", f"gold resolved {g}/{len(gold)} runs: {_reasons(gold)}"
    if g == 0:
        return "gold_fails", _reasons(gold)
    if 0 < e < len(empty):
        return "flaky", f"empty patch resolved {e}/{len(empty)} runs"
    if empty and e == len(empty):
        return "empty_passes", f"empty patch resolved {e}/{len(empty)} runs"
    bare = [r for r in gold if r.get("canary_family") and not r.get("canaries")]
    if bare:
        family = bare[0]["canary_family"]
        return UNGUARDED, (
            f"no canary could be planted in {len(bare)} of {len(gold)} gold runs ({family} runner): its "
            "tests yield none to clone, so a forged test report would be paid"
        )
    return "valid", None


def _decoy_verdict(decoys: list[dict[str, Any]], verdict: str, reason: str | None) -> tuple[str, str | None]:
    """The verdict after the decoy runs of a valid task's gold patch: a tampering verdict there makes the gold
    fail; an infrastructure failure there is an error (never a verdict); else it stands."""
    for r in decoys:
        if r["failure_reason"] in INFRA_REASONS:
            return "error", f"{r['failure_reason']} (decoy run {r['run']}): {r.get('error') or ''}".strip()
        if r["failure_reason"] == RUNNER_TAMPERED:
            return (
                "gold_fails",
                f"{RUNNER_TAMPERED} in decoy run {r['run']}: the gold patch no-ops a guessed test",
            )
    return verdict, reason


def _reasons(runs: list[dict[str, Any]]) -> str:
    """Reason codes with counts, then the first failed run's detail (every failing test counted)."""
    failed = [r for r in runs if not r["resolved"]]
    counts = Counter(r["failure_reason"] for r in failed)
    codes = ", ".join(f"{k}" if n == 1 else f"{k} x{n}" for k, n in sorted(counts.items()))
    detail = next(
        (r["marker"]["failure_detail"] for r in failed if (r.get("marker") or {}).get("failure_detail")), None
    )
    return f"{codes} — {detail}" if detail else codes


def validate_task(
    provider: Provider,
    metadata: Mapping[str, Any],
    gold_patch: str,
    *,
    template: str | None = None,
    repeats: int = default("validation.repeats"),
    parallel: int = 1,
    sandbox_timeout: float = 3600,
    error_attempts: int = ERROR_ATTEMPTS,
    error_backoff: float = ERROR_BACKOFF_S,
    network: str | None = None,
    evidence: list[dict[str, Any]] | None = None,
    evaluate: Callable[..., EvalResult] = evaluate_patch,
    decoys: int = default("validation.decoys"),
) -> dict[str, Any]:
    """Validate one task: gold and empty patch, ``repeats`` fresh evaluations each, ``parallel`` at once.

    A task that would be valid and whose gold runs carried twins of FAIL_TO_PASS tests gets ``decoys``
    decoy runs of the gold patch (as the rollouts' ``evaluate_agent_patch`` does; under ``decoy`` in the
    record): a "gold" patch that guesses which test of a twin cluster is the original and no-ops it is
    caught there (``gold_fails``, runner_tampered), as it is in a rollout.

    A run whose evaluation failed for infrastructure reasons is tried again, up to ``error_attempts``
    tries, waiting ``error_backoff`` * 2**k seconds before try k+2. ``network`` goes to every fresh
    sandbox. Each evaluation's evidence record (log + status map) is appended to ``evidence``.
    Returns the task's validation record (byte-stable except for ``timings``/``runs[*].timings``).
    A gold patch that touches tests or is empty is ``gold_fails`` without running anything.
    """
    iid = str(metadata.get("instance_id", ""))
    template = template or metadata["sandbox_image"]
    t0 = time.monotonic()
    pre_reason, test_files = check_patch(gold_patch)
    jobs = [] if pre_reason else [(k, i) for i in range(repeats) for k in ("gold", "empty")]

    extra: dict[str, Any] = {"trusted_patch": True}
    if network is not None:
        extra["network"] = network
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def one(job: tuple[str, int]) -> dict[str, Any]:
        kind, i = job
        patch = "" if kind == "empty" else gold_patch
        failed: list[str] = []
        kw = {**extra, "decoy": True} if kind == "decoy" else extra
        for attempt in range(1, max(1, error_attempts) + 1):
            res = evaluate(provider, template, dict(metadata), patch, sandbox_timeout=sandbox_timeout, **kw)
            found.setdefault(job, []).append(evidence_record(res, patch=kind, run=i, attempt=attempt))
            if res.failure_reason not in INFRA_REASONS:
                break
            failed.append(f"{res.failure_reason}: {res.error or ''}".strip())
            log.warning(
                "%s %s run %d try %d/%d: infrastructure failure %s (%s)",
                iid, kind, i, attempt, error_attempts, res.failure_reason, res.error,
            )  # fmt: skip
            if attempt < error_attempts:
                time.sleep(error_backoff * 2 ** (attempt - 1))
        log.info("%s %s run %d: resolved=%s reason=%s", iid, kind, i, res.resolved, res.failure_reason)
        return run_record(kind, i, res, failed[: attempt - 1])

    with cf.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        runs = list(pool.map(one, jobs))
    if evidence is not None:
        for job in jobs:
            evidence.extend(found.get(job, []))
    gold = [r for r in runs if r["patch"] == "gold"]
    empty = [r for r in runs if r["patch"] == "empty"]
    verdict, reason = decide(gold, empty, pre_reason)
    decoy_runs = []
    if verdict == "valid" and any(r.get("f2p_twins") for r in gold):
        decoy_jobs = [("decoy", i) for i in range(max(0, decoys))]
        decoy_runs = [one(job) for job in decoy_jobs]
        if evidence is not None:
            for job in decoy_jobs:
                evidence.extend(found.get(job, []))
        verdict, reason = _decoy_verdict(decoy_runs, verdict, reason)
        runs += decoy_runs
    eval_s = [r["timings"].get("eval_s", 0.0) for r in runs]
    total_s = [r["timings"].get("total_s", 0.0) for r in runs]
    return {
        "instance_id": iid,
        "template": template,
        "provider": getattr(provider, "name", ""),
        "repeats": repeats,
        "verdict": verdict,
        "reason": reason,
        "gold_test_files": test_files,
        "gold": {"resolved": sum(r["resolved"] for r in gold), "runs": len(gold)},
        "empty": {"resolved": sum(r["resolved"] for r in empty), "runs": len(empty)},
        "decoys": len(decoy_runs),
        "runs": runs,
        "timings": {
            "wall_s": round(time.monotonic() - t0, 3),
            "eval_s": round(sum(eval_s), 3),
            "sandbox_s": round(sum(total_s), 3),
            "overhead_s": round(sum(total_s) - sum(eval_s), 3),
        },
    }
