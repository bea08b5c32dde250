"""verl's metrics -> sweflow's: one step's metrics, the agent loop's rollout log, the file logger's JSONL.

`convert_verl_log` writes sweflow's metrics.jsonl from verl's file-logger JSONL (`verl_metrics_to_sweflow`
per step), filling what verl lacks from the agent loop's rollout log (`rollout_log_stats`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..util import atomic_write, jsonl_line

# sweflow metrics.jsonl name -> verl per-step metric key (None: verl has no such metric).
VERL_METRIC_KEYS: dict[str, str | None] = {
    "reward_mean": "critic/score/mean",
    "reward_std": None,
    "resolved_share": None,
    "zero_variance_group_share": None,
    "policy_loss": "actor/pg_loss",
    "kl": "actor/kl_loss",
    "clip_fraction": "actor/pg_clipfrac",
    "tis_weight_mean": "rollout_corr/rollout_is_mean",
    "tis_clipped_share": "rollout_corr/rollout_is_ratio_fraction_high",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
    "prompt_tokens": "prompt_length/mean",
    "response_tokens": "response_length/mean",
    "rollout_s": "timing_s/gen",
    "weight_sync_s": "timing_s/update_weights",
}
# The update's share of a step: old logprobs, reference logprobs, advantages and the actor update.
_TRAIN_TIMINGS = ("timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor")


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def verl_metrics_to_sweflow(step_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One verl step's metrics (as its file logger writes them) -> sweflow's metrics.jsonl fields.

    prompt_tokens / response_tokens are means per sample; tokens_per_s is the whole job's
    (perf/total_num_tokens / perf/time_per_step); None where verl reports nothing.
    """
    m = step_metrics
    out: dict[str, Any] = {
        name: (_num(m.get(key)) if key else None) for name, key in VERL_METRIC_KEYS.items()
    }
    train = [_num(m.get(k)) for k in _TRAIN_TIMINGS if k in m]
    out["train_s"] = sum(v for v in train if v is not None) if any(v is not None for v in train) else None
    tokens, step_s = _num(m.get("perf/total_num_tokens")), _num(m.get("perf/time_per_step"))
    out["tokens_per_s"] = tokens / step_s if tokens is not None and step_s else None
    step = m.get("training/global_step")
    out["step"] = int(step) if _num(step) is not None else None
    return out


def _verl_log_files(path_in: str | Path) -> list[Path]:
    path = Path(path_in)
    if path.is_dir():
        return sorted(path.glob("*.jsonl"))
    return [path] if path.exists() else []


def rollout_log_stats(rollout_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Per-step stats from the agent loop's rollout log folder (`SWEFLOW_ROLLOUT_LOG`): reward_std,
    resolved_share, zero_variance_group_share and the tamper verdicts (`tamper_stats`) over the completed
    samples, aborted counts by reason."""
    by_step: dict[int, list[dict]] = {}
    for f in sorted(Path(rollout_dir).glob("*.jsonl")) if Path(rollout_dir).is_dir() else []:
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                by_step.setdefault(rec["step"], []).append(rec)
    out: dict[int, dict[str, Any]] = {}
    for step, recs in by_step.items():
        done = [r for r in recs if not r.get("aborted")]
        rewards = [float(r.get("reward") or 0.0) for r in done]
        groups: dict[str, list[float]] = {}
        for r in done:
            groups.setdefault(str(r.get("group")), []).append(float(r.get("reward") or 0.0))
        aborted: dict[str, int] = {}
        for r in recs:
            if r.get("aborted"):
                reason = str(r.get("failure_reason") or "unknown")
                aborted[reason] = aborted.get(reason, 0) + 1
        from .rollouts import sample_std, tamper_stats

        std = sample_std(rewards) if len(rewards) > 1 else None
        out[step] = {
            "reward_std": std,
            "resolved_share": (sum(1 for r in done if r.get("resolved")) / len(done)) if done else None,
            "zero_variance_group_share": (
                sum(1 for g in groups.values() if len(set(g)) <= 1) / len(groups) if groups else None
            ),
            "aborted": sum(aborted.values()),
            "aborted_by_reason": dict(sorted(aborted.items())),
            **tamper_stats(r.get("failure_reason") for r in done),
        }
    return out


def convert_verl_log(
    path_in: str | Path, path_out: str | Path, *, rollout_dir: str | Path | None = None
) -> int:
    """verl's file-logger JSONL (a file, or the folder of one file per attempt) -> sweflow metrics.jsonl.

    A step logged by several attempts (a resumed run) keeps its last record. Stats verl lacks come from
    the agent loop's rollout log when `rollout_dir` is given. Returns the number of steps written.
    """
    steps: dict[int, dict[str, Any]] = {}
    for f in _verl_log_files(path_in):
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict):
                continue
            if _num(rec.get("step")) is None or "training/global_step" not in rec["data"]:
                continue  # validation-only records carry no training step
            row = verl_metrics_to_sweflow(rec["data"])
            row["step"] = int(rec["step"])
            steps[row["step"]] = row
    extra = rollout_log_stats(rollout_dir) if rollout_dir else {}
    for step, row in steps.items():
        for key, value in extra.get(step, {}).items():
            if row.get(key) is None:
                row[key] = value
    atomic_write(path_out, "".join(jsonl_line(steps[s]) for s in sorted(steps)))
    return len(steps)
