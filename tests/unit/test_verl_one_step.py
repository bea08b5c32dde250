"""One optimizer step per rollout step on verl's v1 trainer: 129-256 outputs (compacted sessions give
several) are padded by verl's own `upsample_batch_to_divisible_size` and updated as ONE mini-batch, and the
per-sample mean divides by the real rows only.

The test runs verl 0.9.1's own code: `PPOTrainer._get_required_batch_multiple`, the padding function (over
an in-memory stand-in of TransferQueue's two calls), `PPOTrainer._update_actor` and the mini-batch iterator
its worker uses (`tensordict_utils.make_iterator`, as `train_mini_batch` calls it per dp rank).
"""

from __future__ import annotations

import math
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo import padding_utils  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from sweflow.train import verl_one_step  # noqa: E402

N = 16  # samples per prompt (the recipe's)
PROMPTS = 8  # prompts per step: 8 x 16 = 128 sessions
DP = 4  # 4 nodes x 8 GPUs at TP 2 x CP 4


class MemoryTQ:
    """TransferQueue's kv_batch_get / kv_batch_put over a dict (what verl's padding calls)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def kv_batch_get(self, keys, partition_id=None):
        return [self.rows[k] for k in keys]

    def kv_batch_put(self, keys, partition_id=None, fields=None, tags=None):
        for i, key in enumerate(keys):
            self.rows[key] = {k: fields[k][i] for k in fields.keys()}


def session_rows(outputs: int, store: MemoryTQ) -> KVBatchMeta:
    """`outputs` rows in verl v1's key shape `{uid}_{session}_{index}`: 128 sessions, the first
    `outputs - 128` of them compacted once (two outputs each)."""
    keys, tags = [], []
    extra = outputs - PROMPTS * N
    for s in range(PROMPTS * N):
        for index in range(2 if s < extra else 1):
            key = f"uid{s // N}_{s % N}_{index}"
            store.rows[key] = {
                "prompts": torch.arange(5),
                "responses": torch.arange(7),
                "input_ids": torch.arange(12),
                "attention_mask": torch.ones(12, dtype=torch.int64),
                "position_ids": torch.arange(12),
                "response_mask": torch.ones(7, dtype=torch.int64),
            }
            keys.append(key)
            tags.append({"seq_len": 12, "prompt_len": 5, "response_len": 7})
    assert len(keys) == outputs
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train", fields=None, extra_info={})


class Group:
    """The actor worker group: `update_actor` runs verl's mini-batch iterator on each dp rank's share."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def update_actor(self, batch: KVBatchMeta) -> dict:
        info = dict(batch.extra_info)
        per_rank = len(batch) // DP
        steps = 0
        for rank in range(DP):
            share = TensorDict({"x": torch.zeros(per_rank, 1)}, batch_size=[per_rank])
            mini = info["mini_batch_size"] // DP  # train_mini_batch's mini_batch_size_per_gpu
            steps = sum(1 for _ in tu.make_iterator(share, mini, info["epochs"], seed=rank))
        self.calls.append({**info, "rows": len(batch), "optimizer_steps": steps})
        return {"metrics": {"mfu": [0.0]}}


def trainer(patched: bool) -> types.SimpleNamespace:
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {
                    "ppo_mini_batch_size": PROMPTS,
                    "ppo_epochs": 1,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "data_loader_seed": 1,
                    "shuffle": False,
                },
                "rollout": {"n": N, "temperature": 1.0},
            },
            "trainer": {"critic_warmup": 0},
        }
    )
    # a subclass of the synchronous trainer the recipe runs, so the patch stays local to the test
    # (unpatched: verl's own methods, even where importing sweflow.train.verl_advantage patched verl's class)
    own = {
        name: getattr(getattr(PPOTrainerSync, name), "__wrapped__", getattr(PPOTrainerSync, name))
        for name in ("_get_required_batch_multiple", "_update_actor")
    }
    cls = type("Trainer", (PPOTrainerSync,), own)
    if patched:
        assert verl_one_step.install_one_step(cls)
    t = cls.__new__(cls)
    t.config, t.use_critic, t.global_steps = cfg, False, 1
    t.actor_rollout_wg = Group()
    return t


def run_step(t, outputs: int, monkeypatch) -> dict:
    store = MemoryTQ()
    monkeypatch.setattr(padding_utils, "tq", store)
    batch = session_rows(outputs, store)
    multiple = t._get_required_batch_multiple(DP)
    batch = padding_utils.upsample_batch_to_divisible_size(batch, multiple, eos_token_id=2)
    metrics: dict = {}
    t._update_actor(batch, metrics)
    (call,) = t.actor_rollout_wg.calls
    return {**call, "multiple": multiple, "metrics": metrics}


@pytest.mark.parametrize("outputs", [128, 129, 200, 256])
def test_one_optimizer_step_at_any_output_count(outputs, monkeypatch):
    t = trainer(patched=True)
    got = run_step(t, outputs, monkeypatch)
    assert got["multiple"] == math.lcm(DP, N)
    assert got["rows"] == math.ceil(outputs / 16) * 16  # verl's padding, to lcm(dp, n) only
    assert got["optimizer_steps"] == 1
    assert got["mini_batch_size"] == got["rows"]
    assert got["global_batch_size"] == outputs  # padding rows weigh nothing in the per-sample mean
    assert got["metrics"]["sweflow/update_real_rows"] == outputs
    # the configured mini-batch is restored, and the worker group keeps its own method
    assert t.config.actor_rollout_ref.actor.ppo_mini_batch_size == PROMPTS
    assert "update_actor" not in vars(t.actor_rollout_wg)


@pytest.mark.parametrize(("outputs", "steps"), [(128, 1), (129, 2), (256, 2)])
def test_unpatched_verl_takes_two_steps_past_128(outputs, steps, monkeypatch):
    """What the patch changes: verl's own rule pads 129 outputs to 256 rows, two optimizer steps."""
    got = run_step(trainer(patched=False), outputs, monkeypatch)
    assert got["multiple"] == math.lcm(DP, PROMPTS * N)
    assert got["optimizer_steps"] == steps


def test_install_is_idempotent_and_the_launch_loads_it():
    cls = type("Trainer", (PPOTrainerSync,), {})
    assert verl_one_step.install_one_step(cls) and verl_one_step.install_one_step(cls)
    wrapped = cls._update_actor
    assert wrapped._sweflow_one_step  # wrapped once, not twice
    assert not getattr(wrapped.__wrapped__, "_sweflow_one_step", False)
    # the module verl loads through $VERL_USE_EXTERNAL_MODULES installs it on verl's own class
    from sweflow.train import verl_advantage

    assert verl_advantage.install()
    assert getattr(trainer_base.PPOTrainer._update_actor, "_sweflow_one_step", False)
