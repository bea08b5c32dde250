"""One optimizer step per rollout step on verl's v1 trainer, however many outputs the step's sessions gave.

`install_one_step` wraps two methods of verl's trainer class (loaded with sweflow's advantage estimator).
"""

# verl v1 pads a step's batch to a multiple of lcm(dp, ppo_mini_batch_size x n) and updates the actor once per
# mini-batch of ppo_mini_batch_size x n rows. A compacted or forked session gives several outputs, so a step
# of the recipe's 128 sessions that yields 129 outputs becomes 256 rows and TWO optimizer steps, the second
# almost all padding. The recipe takes one step per rollout (its global batch is the whole rollout), so:
# - the batch is padded to a multiple of lcm(dp, n) only (verl's own `upsample_batch_to_divisible_size`
# still pads: at most lcm(dp, n) - 1 rows, 15 in the recipe);
# - the actor update takes the whole padded batch as ONE mini-batch, and the loss's sample count
# (`global_batch_size`, the divisor of the per-sample mean) is the number of real rows, so padding rows
# weigh nothing and every real sample weighs 1/rows, as in the recipe's per-sample mean.

from __future__ import annotations

import functools
import logging
import math
from typing import Any

log = logging.getLogger("sweflow.train.verl")

_MARK = "_sweflow_one_step"


def real_rows(tags: list[dict[str, Any]]) -> int:
    """The rows of a batch that are not verl's synthetic padding (`is_padding` in their tag)."""
    return sum(1 for tag in tags if not (tag or {}).get("is_padding", False))


def _batch_multiple(original: Any) -> Any:
    @functools.wraps(original)
    def required_multiple(self: Any, dp_size: int) -> int:
        if getattr(self, "use_critic", False):  # GRPO has no critic; a critic keeps verl's own rule
            return original(self, dp_size)
        # verl's actor update takes its mini-batch as ppo_mini_batch_size x n rows: a multiple of n too
        return math.lcm(int(dp_size), int(self.config.actor_rollout_ref.rollout.n))

    setattr(required_multiple, _MARK, True)
    return required_multiple


def _update_actor(original: Any) -> Any:
    @functools.wraps(original)
    def update_actor(self: Any, batch: Any, metrics: dict) -> Any:
        actor = self.config.actor_rollout_ref.actor
        n = int(self.config.actor_rollout_ref.rollout.n)
        rows = len(batch)
        if getattr(self, "use_critic", False) or rows % n:
            return original(self, batch, metrics)
        real = real_rows(list(batch.tags))
        group = self.actor_rollout_wg
        forward = group.update_actor

        def one_update(b: Any) -> Any:
            # verl sets global_batch_size to the mini-batch's row count, padding included
            b.extra_info["global_batch_size"] = max(real, 1)
            return forward(b)

        configured = actor.ppo_mini_batch_size
        own = "update_actor" in vars(group)  # verl binds worker-group methods on the instance
        group.update_actor = one_update
        try:
            actor.ppo_mini_batch_size = rows // n  # verl multiplies it by n: one mini-batch of every row
            out = original(self, batch, metrics)
        finally:
            actor.ppo_mini_batch_size = configured
            if own:
                group.update_actor = forward
            else:
                del group.update_actor
        metrics["sweflow/update_rows"] = rows
        metrics["sweflow/update_real_rows"] = real
        return out

    setattr(update_actor, _MARK, True)
    return update_actor


def install_one_step(trainer_cls: Any) -> bool:
    """Patch verl's v1 trainer class (idempotent); False when it lacks the two methods (another verl)."""
    names = {"_get_required_batch_multiple": _batch_multiple, "_update_actor": _update_actor}
    if not all(callable(getattr(trainer_cls, name, None)) for name in names):
        log.warning("verl's trainer has no %s: a step may take several optimizer steps", sorted(names))
        return False
    for name, wrap in names.items():
        current = getattr(trainer_cls, name)
        if not getattr(current, _MARK, False):
            setattr(trainer_cls, name, wrap(current))
    return True
