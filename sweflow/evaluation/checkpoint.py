"""One checkpoint on held-out tasks: the agent `k` times per task through the proxy, on an engine serving the
checkpoint, each patch graded in a fresh sandbox by the training's own rules (`run_attempts`).

`attempt_record` is what an attempt leaves (no patch text in it: that goes to the predictions file);
`SeededEngine` seeds each model call from the evaluation's seed, the session and the turn: a run repeats.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..proxy.engines import turn_seed

log = logging.getLogger("sweflow.evaluate")


class SeededEngine:
    """`engine` with every model call's sampling seed drawn from `seed`, the session and the turn
    (`turn_seed`, as GRPO's rollouts): the same checkpoint and seed sample the same tokens in any order."""

    def __init__(self, engine: Any, seed: int) -> None:
        self.engine, self.seed = engine, int(seed)

    def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        seed = turn_seed(self.seed, sampling.request_id, len(prompt_ids))
        return self.engine.generate(prompt_ids, dataclasses.replace(sampling, seed=seed))


def _tokens(result: Any) -> int:
    """The tokens the model produced in one attempt (every sample's response part)."""
    total = 0
    for s in result.samples or []:
        mask = s.get("loss_mask")
        total += (
            int(sum(mask))
            if mask
            else max(0, len(s.get("token_ids") or []) - int(s.get("prompt_length") or 0))
        )
    return total


def attempt_record(result: Any) -> dict[str, Any]:
    """One attempt: its task and index, whether it was graded (`completed`) or lost to the infrastructure
    (`aborted`, no verdict), resolved, reward, failure reason, turns, tokens, the patch's size."""
    return {
        "instance_id": result.instance_id,
        "attempt": int(result.group_index),
        "status": result.status,
        "resolved": bool(result.resolved) and not result.aborted,
        "reward": float(result.reward),
        "failure_reason": result.failure_reason,
        "turns": int(result.num_turns),
        "tokens": _tokens(result),
        "patch_bytes": int((result.patch or {}).get("bytes") or len(result.patch_text or "")),
        "error": result.error,
    }


def run_attempts(
    rollouts: Any, rows: Sequence[Mapping[str, Any]], k: int, *, prefix: str, retries: int = 1
) -> list[Any]:
    """`k` attempts at each row with `rollouts` (a started `PolicyRollouts`), results in (row, attempt)
    order; an attempt the infrastructure lost is tried again up to `retries` times (it is never graded)."""
    jobs = [(dict(r), i) for r in rows for i in range(k)]
    results = list(rollouts.run(jobs, prefix=prefix))
    for n in range(retries):
        lost = [i for i, r in enumerate(results) if r.aborted]
        if not lost:
            break
        log.warning(
            "%d attempt(s) lost to the infrastructure; trying them again (%d/%d)", len(lost), n + 1, retries
        )
        again = rollouts.run([jobs[i] for i in lost], prefix=f"{prefix}retry{n + 1}.")
        for i, r in zip(lost, again, strict=True):
            results[i] = r
    return results
