"""Resolve-rate figures of one checkpoint's attempts: pass@1 with a bootstrap interval, unbiased pass@k.

`resolve_figures(attempts, k)` takes one record per attempt (`instance_id`, `resolved`, `failure_reason`, `turns`,
`tokens`) and gives the figures the report and the model card show.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), for n attempts of which
    c resolved; k <= n."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} needs 0 < k <= n and 0 <= c <= n (n={n}, c={c})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def per_task(attempts: Iterable[Mapping[str, Any]]) -> dict[str, list[bool]]:
    """instance_id -> the resolved flag of each of its attempts, in attempt order."""
    out: dict[str, list[bool]] = defaultdict(list)
    for a in sorted(attempts, key=lambda a: (a["instance_id"], int(a.get("attempt", 0)))):
        out[a["instance_id"]].append(bool(a["resolved"]))
    return dict(out)


def bootstrap_interval(
    values: Sequence[float],
    *,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of `values` (tasks resampled with replacement; seeded,
    so the same attempts give the same interval)."""
    if not values:
        return (0.0, 0.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int(math.floor((1 - confidence) / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 + confidence) / 2 * (resamples - 1)))]
    return (lo, hi)


def resolve_figures(attempts: Sequence[Mapping[str, Any]], k: int, *, seed: int) -> dict[str, Any]:
    """pass@1 (each task's resolved share, averaged over tasks) with its bootstrap interval over tasks,
    pass@k (unbiased, averaged over tasks; k capped at each task's attempts), the ids resolved at least once,
    failure reasons by count, and turns and tokens per attempt."""
    tasks = per_task(attempts)
    shares = [sum(r) / len(r) for r in tasks.values()]
    lo, hi = bootstrap_interval(shares, seed=seed)
    at_k = [pass_at_k(len(r), sum(r), min(k, len(r))) for r in tasks.values()]
    reasons = Counter(str(a.get("failure_reason") or "resolved") for a in attempts if not a["resolved"])
    turns = [int(a.get("turns") or 0) for a in attempts]
    tokens = [int(a.get("tokens") or 0) for a in attempts]
    return {
        "tasks": len(tasks),
        "attempts": len(attempts),
        "k": k,
        "pass@1": sum(shares) / len(shares) if shares else 0.0,
        "pass@1_interval": [lo, hi],
        "confidence": CONFIDENCE,
        f"pass@{k}": sum(at_k) / len(at_k) if at_k else 0.0,
        "resolved_ids": sorted(i for i, r in tasks.items() if any(r)),
        "failure_reasons": dict(sorted(reasons.items())),
        "turns_mean": sum(turns) / len(turns) if turns else 0.0,
        "tokens_mean": sum(tokens) / len(tokens) if tokens else 0.0,
    }
