"""The GRPO formulas sweflow trains with, as small pure functions on tensors (one place for each).

Each formula is written above its function. The TRL engine computes its loss with `grpo_loss`; verl's own
core_algos are configured to the same formulas, and verl's advantages with whitening come from
`group_advantages` + `whiten` too (sweflow.train.verl_advantage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..schema import default

# Tests check both (the TRL engine's loss and verl's whitened advantages) against numbers computed from the
# formulas.

KL_CLAMP = 10.0


# `group_advantages`: A_i = (r_i - mean_g) / (std_g + eps) over each group's *valid* samples (std unbiased);
# aborted samples and groups left with fewer than 2 valid samples get 0 (no gradient).
def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Any],
    valid: Sequence[bool],
    *,
    norm_by_std: bool = default("train.advantage.norm_by_std"),
    eps: float = default("train.advantage.eps"),
) -> list[float]:
    """One advantage per sample; `groups[i]` names sample i's group (the prompt it was sampled for)."""
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        if valid[i]:
            members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        vals = [float(rewards[i]) for i in idx]
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
        scale = (var**0.5 + eps) if norm_by_std else 1.0
        for i, v in zip(idx, vals, strict=True):
            out[i] = (v - mean) / scale
    return out


# `whiten`: batch whitening of token advantages over the loss tokens (masked mean, Bessel variance, eps 1e-8),
# the recipe's second step after `group_advantages` (slime's --normalize-advantages).
def whiten(values: Any, mask: Any, eps: float = 1e-8, *, all_reduce: Any = None) -> Any:
    """(values - masked mean) / sqrt(masked Bessel variance + eps), zero outside the mask.

    `all_reduce(t) -> t` sums a tensor over the processes that share the batch (e.g. accelerate's
    `reduce(t, "sum")`), so each one whitens its share with the statistics of the whole batch."""
    import torch

    total = all_reduce or (lambda t: t)
    mask = mask.to(values.dtype)
    n, s = total(torch.stack([mask.sum(), (values * mask).sum()]))
    mean = s / n
    var = total((((values - mean) ** 2) * mask).sum()) / (n - 1).clamp(min=1)
    return (values - mean) * (var + eps).rsqrt() * mask


# `tis_weights`: token TIS w_t = clamp(exp(logp_old - logp_rollout), 0, cap), no gradient.
def tis_weights(old_logp: Any, rollout_logp: Any, cap: float) -> Any:
    """Truncated importance weights of the trainer's old policy over the rollout engine's policy."""
    import torch

    return torch.clamp(torch.exp(old_logp - rollout_logp), min=0.0, max=cap).detach()


# `k3_kl`: low_var_kl with d = logp_ref - logp: exp(d) - 1 - d, clamped to [-10, 10].
def k3_kl(logp: Any, ref_logp: Any) -> Any:
    """The low-variance (k3) KL estimate per token, clamped like the reference trainers clamp it."""
    import torch

    delta = ref_logp - logp
    return torch.clamp(torch.exp(delta) - 1 - delta, min=-KL_CLAMP, max=KL_CLAMP)


# `ppo_clip_loss`: max(-A r, -A clamp(r, 1 - eps_low, 1 + eps_high)), r = exp(logp - logp_old).
def ppo_clip_loss(logp: Any, old_logp: Any, advantages: Any, clip_low: float, clip_high: float) -> tuple:
    """(per-token clipped policy loss, per-token 'was clipped' flag) with the asymmetric high side."""
    import torch

    ratio = torch.exp(logp - old_logp)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(loss1, loss2), (loss2 > loss1).to(logp.dtype)


# `per_sample_mean`: mean over each sample's loss tokens, then over samples.
def per_sample_mean(values: Any, mask: Any, weight: Any = None) -> Any:
    """Mean over each sample's loss tokens, then over the samples (a sample with no loss token counts 0).

    `weight` (B,) scales each sample's term: the TRL engine gives aborted samples 0 and the others
    samples / valid samples, so dropping a sample does not shrink the update."""
    mask = mask.to(values.dtype)
    per_sample = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    if weight is not None:
        per_sample = per_sample * weight.to(per_sample.dtype)
    return per_sample.mean()


def masked_mean(values: Any, mask: Any) -> float:
    mask = mask.to(values.dtype)
    total = mask.sum()
    return float((values * mask).sum() / total) if float(total) > 0 else 0.0


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = default("train.clip.low")
    clip_high: float = default("train.clip.high")
    kl_coef: float = default("train.kl.coef")
    tis: bool = default("train.tis.level") == "token"
    tis_cap: float = default("train.tis.cap")
    entropy_coef: float = default("train.entropy_coef")

    @classmethod
    def from_recipe(cls, r: Any) -> LossConfig:
        return cls(
            clip_low=r.clip_low,
            clip_high=r.clip_high,
            kl_coef=r.kl_coef,
            tis=r.tis_level == "token",
            tis_cap=r.tis_cap,
            entropy_coef=r.entropy_coef,
        )


# `grpo_loss`: the recipe's loss from those pieces, with the per-step statistics the metrics report.
def grpo_loss(
    logp: Any,
    old_logp: Any,
    advantages: Any,
    mask: Any,
    cfg: LossConfig,
    *,
    rollout_logp: Any = None,
    ref_logp: Any = None,
    entropy: Any = None,
    sample_weight: Any = None,
) -> tuple[Any, dict[str, float]]:
    """The recipe's loss on (B, T) tensors; `advantages` is (B,) or (B, T); `mask` marks the loss tokens
    (model-generated, not tool output). Returns (loss, stats)."""
    import torch

    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1).expand_as(logp)
    pg, clipped = ppo_clip_loss(logp, old_logp, adv, cfg.clip_low, cfg.clip_high)
    stats: dict[str, float] = {"clip_fraction": masked_mean(clipped, mask)}
    if cfg.tis and rollout_logp is not None:
        raw = torch.exp(old_logp - rollout_logp).detach()
        weights = torch.clamp(raw, min=0.0, max=cfg.tis_cap)
        pg = pg * weights
        stats["tis_weight_mean"] = masked_mean(weights, mask)
        stats["tis_clipped_share"] = masked_mean((raw > cfg.tis_cap).to(logp.dtype), mask)
    policy_loss = per_sample_mean(pg, mask, sample_weight)
    loss = policy_loss
    stats["policy_loss"] = float(policy_loss.detach())
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        kl_loss = per_sample_mean(kl, mask, sample_weight)
        stats["kl"] = float(kl_loss.detach())
        if cfg.kl_coef:
            loss = loss + cfg.kl_coef * kl_loss
    if entropy is not None:
        ent = per_sample_mean(entropy, mask, sample_weight)
        stats["entropy"] = float(ent.detach())
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    return loss, stats
