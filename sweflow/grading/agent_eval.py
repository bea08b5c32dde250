"""An agent's (untrusted) patch: ``evaluate_patch`` with retries, a control sandbox for a lost one, decoy runs.

Infrastructure failures are retried in new sandboxes. When the sandbox is lost or the deadline passes on
every retry while a control sandbox of the same template starts and answers, the patch is what broke the
evaluation, and that is a grade (patch_defeated_evaluation, reward 0).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..sandbox.base import Provider, Sandbox
from .canary import F2P
from .evaluate import EvalResult, _bounded, evaluate_patch
from .reasons import FRESH_EVAL_TIMEOUT, PATCH_DEFEATED_EVALUATION, RUNNER_TAMPERED, SANDBOX_LOST

log = logging.getLogger("sweflow.grading.evaluate")  # one logger for the whole evaluation
# decoy runs after a resolved agent patch with FAIL_TO_PASS twins (one pays a forger that forges with chance r
# at most r(1-r) <= 1/4 and catches it as often; validation's own count is validation.decoys)
AGENT_DECOYS = 1


def evaluate_agent_patch(
    provider: Provider,
    template: str,
    metadata: dict,
    patch: str,
    *,
    attempts: int = 2,
    backoff: float = 5.0,
    network: str | None = None,
    sleep: Any = time.sleep,
    decoys: int = AGENT_DECOYS,
    **options: Any,
) -> EvalResult:
    """``evaluate_patch`` for an agent's (untrusted) patch: infrastructure failures are retried in new
    sandboxes (``attempts`` in all, ``backoff`` seconds doubling). If every try lost its sandbox or passed
    the deadline and the patch is not empty, a control sandbox of ``template`` is started and asked to
    answer: when it does, the provider is healthy and the patch itself defeated its evaluation (code that
    kills the sandbox, hangs past every timeout): reward 0, patch_defeated_evaluation. When the control
    fails too, the result stays an infrastructure failure (the sample is aborted, never graded).

    A resolved run whose canaries include twins of FAIL_TO_PASS tests is followed by ``decoys`` decoy
    runs (fresh sandboxes, the same patch): there the FAIL_TO_PASS tests themselves carry moved expected
    literals, so no run shows an original beside its twins, and code that guesses which test of a cluster
    is the original and no-ops it is caught (runner_tampered) in the decoy whenever it forges there. An
    infrastructure failure of a decoy is the evaluation's (never a verdict)."""
    res = _graded(provider, template, metadata, patch, attempts, backoff, network, sleep, options)
    if not (res.resolved and any(c.get("of") == F2P for c in res.canaries)):
        return res
    for n in range(max(0, decoys)):
        d = _graded(
            provider, template, metadata, patch, attempts, backoff, network, sleep, {**options, "decoy": True}
        )
        res.timings[f"decoy{n + 1}_s"] = d.timings.get("total_s", 0.0)
        if d.infra or d.failure_reason in (RUNNER_TAMPERED, PATCH_DEFEATED_EVALUATION):
            log.warning(
                "fresh evaluation of %s: decoy run %d: %s",
                metadata.get("instance_id"),
                n + 1,
                d.failure_reason,
            )
            d.timings = {**res.timings, **{f"decoy_{k}": v for k, v in d.timings.items()}}
            return d
    return res


def _graded(
    provider: Provider,
    template: str,
    metadata: dict,
    patch: str,
    attempts: int,
    backoff: float,
    network: str | None,
    sleep: Any,
    options: dict[str, Any],
) -> EvalResult:
    """One graded run with retries, or the patch named as what defeated it (see ``evaluate_agent_patch``)."""
    tries: list[EvalResult] = []
    for i in range(max(1, attempts)):
        res = evaluate_patch(provider, template, metadata, patch, network=network, **options)
        if not res.infra:
            return res
        tries.append(res)
        log.warning(
            "fresh evaluation of %s, try %d/%d: %s (%s)",
            metadata.get("instance_id"),
            i + 1,
            attempts,
            res.failure_reason,
            res.error,
        )
        if i + 1 < attempts:
            sleep(backoff * 2**i)
    defeated = {SANDBOX_LOST, FRESH_EVAL_TIMEOUT}
    if patch.strip() and all(r.failure_reason in defeated for r in tries):
        healthy, why = _provider_answers(provider, template, network)
        if healthy:
            last = tries[-1]
            detail = "; ".join(f"try {n + 1}: {r.failure_reason}: {r.error}" for n, r in enumerate(tries))
            log.warning(
                "fresh evaluation of %s: the patch defeated it (%s)", metadata.get("instance_id"), detail
            )
            return EvalResult(
                0.0,
                False,
                PATCH_DEFEATED_EVALUATION,
                None,
                _bounded(f"{detail}\n{last.output_tail}"),
                last.timings,
                None,
                exit_code=last.exit_code,
                log=last.log,
            )
        log.warning("control sandbox of %s failed too (%s): infrastructure", template, why)
    return tries[-1]


def _provider_answers(provider: Provider, template: str, network: str | None) -> tuple[bool, str]:
    """Whether a new sandbox of ``template`` starts and runs a command (the provider is healthy)."""
    sb: Sandbox | None = None
    try:
        sb = provider.create(
            template,
            timeout=300,
            metadata={"purpose": "control"},
            **({"network": network} if network is not None else {}),
        )
        r = sb.run("echo sweflow-control", timeout=60)
        return (r.ok and "sweflow-control" in r.stdout), f"exit {r.exit_code}"
    except Exception as exc:  # noqa: BLE001 - any fault means the provider is not healthy
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        if sb is not None:
            try:
                sb.kill()
            except Exception as exc:  # noqa: BLE001 - a leak is logged, the answer stands
                log.warning("killing control sandbox %s failed: %s", getattr(sb, "id", "?"), exc)
