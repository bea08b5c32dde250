"""The recipe's advantages on verl: group normalisation, then whitening over the batch's loss tokens.

This module registers `ESTIMATOR` in verl's advantage-estimator registry, built from sweflow's formulas
(`algos.group_advantages`, then `algos.whiten`), so `algorithm.adv_estimator: sweflow_grpo_whiten` selects
it; `install()` routes it through verl's per-session rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..schema import default
from . import verl_deadline, verl_one_step
from .algos import group_advantages, whiten
from .verl_engine import WHITEN_ESTIMATOR as ESTIMATOR
from .verl_engine import WHITEN_MODULE

# slime's `--normalize-advantages` (on in the recipe) whitens the group-normalised token advantages over every
# loss token of the step; verl's own GRPO estimator stops after the group step.

log = logging.getLogger("sweflow.train.verl")
assert WHITEN_MODULE == __name__, "verl_engine.WHITEN_MODULE must name this module"


def final_rows(batch_keys: Sequence[str]) -> list[int]:
    """For each row, the row of its session's final output (verl v1 keys `{uid}_{session}_{index}`)."""
    last: dict[str, tuple[int, int]] = {}
    sessions = []
    for row, key in enumerate(batch_keys):
        fields = str(key).rsplit("_", 2)
        if len(fields) != 3 or not fields[2].isdigit():
            raise ValueError(f"batch key {key!r} is not verl's {{uid}}_{{session}}_{{index}}")
        session, index = f"{fields[0]}_{fields[1]}", int(fields[2])
        sessions.append(session)
        if session not in last or last[session][0] < index:
            last[session] = (index, row)
    return [last[s][1] for s in sessions]


def token_advantages(
    scores: Sequence[float],
    groups: Sequence[Any],
    response_mask: Any,
    *,
    final: Sequence[int] | None = None,
    norm_by_std: bool = default("train.advantage.norm_by_std"),
    eps: float = default("train.advantage.eps"),
) -> Any:
    """(B, T) whitened advantages of B outputs with outcome `scores` and GRPO `groups` (the prompt uid).

    `final[i]` is the row whose sample output i belongs to (its session's final output; default: itself):
    the group statistics count each sample once and every output of a sample gets its advantage. Then
    whitening over the loss tokens (`response_mask`) of the whole batch.
    """
    import torch

    rows = list(range(len(scores))) if final is None else [int(r) for r in final]
    samples = sorted(set(rows))
    adv = group_advantages(
        [float(scores[r]) for r in samples],
        [groups[r] for r in samples],
        [True] * len(samples),
        norm_by_std=norm_by_std,
        eps=eps,
    )
    by_row = dict(zip(samples, adv, strict=True))
    mask = response_mask.to(torch.float32)
    per_sample = torch.tensor([by_row[r] for r in rows], dtype=torch.float32, device=mask.device)
    return whiten(per_sample.unsqueeze(-1) * mask, mask)


# Differences from verl's GRPO besides the whitening: a group left with one finished sample gets advantage 0
# before whitening (sweflow's `group_advantages`; verl keeps its raw reward), as the TRL engine does.
def compute_grpo_whiten_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **_: Any,
) -> tuple[Any, Any]:
    """verl's estimator signature: (advantages, returns), both the whitened (B, T) advantages.

    verl passes the algorithm config (`norm_adv_by_std_in_grpo` is read from it) and the uid of each row.
    """
    norm = (
        getattr(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
        if config is not None
        else (norm_adv_by_std_in_grpo)
    )
    scores = token_level_rewards.sum(dim=-1).tolist()
    adv = token_advantages(scores, list(index), response_mask, norm_by_std=bool(norm), eps=epsilon)
    adv = adv.to(token_level_rewards.dtype)
    return adv, adv


_VERL_MULTI: Any = None


# Sessions: verl's v1 trainer keys an output `{uid}_{session}_{index}` (a compacted session gives several)
# and, for its GRPO only, takes the group statistics from each session's final output and gives the earlier
# outputs the same advantage. Any other estimator sees one sample per output. `install()` (run at import)
# routes this estimator through the same rule in `verl.trainer.ppo.v1.trainer_base`; other estimators go to
# verl's function unchanged.
def compute_advantage_for_multi_trajectories(
    data: Any,
    batch_keys: Sequence[str],
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> Any:
    """verl v1's `compute_advantage_for_multi_trajectories`, with sessions for `ESTIMATOR` (see above)."""
    if str(getattr(adv_estimator, "value", adv_estimator)) != ESTIMATOR:
        return _VERL_MULTI(
            data,
            batch_keys=batch_keys,
            adv_estimator=adv_estimator,
            gamma=gamma,
            lam=lam,
            num_repeat=num_repeat,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    rewards = data.batch["token_level_rewards"]
    adv = token_advantages(
        rewards.sum(dim=-1).tolist(),
        list(data.non_tensor_batch["uid"]),
        data.batch["response_mask"],
        final=final_rows(batch_keys),
        norm_by_std=bool(norm_adv_by_std_in_grpo),
    ).to(rewards.dtype)
    data.batch["advantages"] = adv
    data.batch["returns"] = adv
    return data


# This module registers `ESTIMATOR` in verl's advantage-estimator registry
# (`verl.trainer.ppo.core_algos.register_adv_est`), built from sweflow's formulas (`algos.group_advantages`,
# then `algos.whiten`), so `algorithm.adv_estimator: sweflow_grpo_whiten` selects it.
def register_estimator() -> None:
    """Put `ESTIMATOR` in verl's registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    if ESTIMATOR not in core_algos.ADV_ESTIMATOR_REGISTRY:
        core_algos.register_adv_est(ESTIMATOR)(compute_grpo_whiten_advantage)


def install() -> bool:
    """Route `ESTIMATOR` through the per-session rule of verl's v1 trainer, make each rollout step one
    optimizer step (`verl_one_step`) and stop before Slurm's time limit (`verl_deadline`); False where the
    trainer cannot load."""
    global _VERL_MULTI
    try:
        from verl.trainer.ppo.v1 import trainer_base
    except ImportError as exc:  # a process without the v1 trainer's dependencies never computes advantages
        log.debug("verl's v1 trainer is not importable here (%s); sessions stay per output", exc)
        return False
    current = trainer_base.compute_advantage_for_multi_trajectories
    if current is not compute_advantage_for_multi_trajectories:
        _VERL_MULTI = current
        trainer_base.compute_advantage_for_multi_trajectories = compute_advantage_for_multi_trajectories
    verl_one_step.install_one_step(trainer_base.PPOTrainer)  # one optimizer step per rollout step
    try:
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    except ImportError as exc:
        log.debug("verl's sync trainer is not importable here (%s)", exc)
    else:
        verl_deadline.install_deadline(PPOTrainerSync)  # save and stop before Slurm's time limit
    return True


# Loading: verl imports the modules named in $VERL_USE_EXTERNAL_MODULES whenever `verl` is imported; the
# launch script (`verl_engine.launch_script`) exports it before Ray starts, so every Ray worker, the trainer's
# driver (which computes the advantages) included, registers the estimator.
register_estimator()
install()
