"""The recipe's advantages on verl: sweflow's estimator, loaded the way verl loads plugins, gives group
normalisation then whitening over the batch's loss tokens (numbers computed here from the formulas)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from sweflow.train import verl_advantage as va  # noqa: E402
from sweflow.train.algos import whiten  # noqa: E402
from sweflow.train.recipe import Parallel, Recipe  # noqa: E402
from sweflow.train.verl_engine import WHITEN_ESTIMATOR, WHITEN_MODULE, launch_script  # noqa: E402

EPS = 1e-6


def _group_then_whiten(scores, groups, mask):
    """Reference: A_i = (r_i - mean_g) / (unbiased std_g + 1e-6), then (A - mu) / sqrt(var + 1e-8) over
    the mask's tokens (Bessel variance); a group of one gets 0 before whitening."""
    by: dict[str, list[float]] = {}
    for g, r in zip(groups, scores, strict=True):
        by.setdefault(g, []).append(r)
    adv = []
    for g, r in zip(groups, scores, strict=True):
        xs = by[g]
        if len(xs) < 2:
            adv.append(0.0)
            continue
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
        adv.append((r - m) / (sd + EPS))
    toks = [adv[i] for i, row in enumerate(mask) for m in row if m]
    mu = sum(toks) / len(toks)
    var = sum((v - mu) ** 2 for v in toks) / (len(toks) - 1)
    return [[(adv[i] - mu) / math.sqrt(var + 1e-8) if m else 0.0 for m in row] for i, row in enumerate(mask)]


@pytest.mark.slow
def test_verls_plugin_variable_registers_the_estimator_and_the_session_rule_in_a_fresh_process():
    probe = (
        "import json, verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "from verl.trainer.ppo.v1 import trainer_base\n"
        f"print(json.dumps([{WHITEN_ESTIMATOR!r} in core_algos.ADV_ESTIMATOR_REGISTRY,"
        " trainer_base.compute_advantage_for_multi_trajectories.__module__]))\n"
    )

    def run(env_value):
        env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
        if env_value:
            env["VERL_USE_EXTERNAL_MODULES"] = env_value
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run(WHITEN_MODULE) == [True, WHITEN_MODULE]
    assert run(None) == [False, "verl.trainer.ppo.v1.utils"]  # without it verl is untouched


def test_the_estimator_through_verls_compute_advantage_is_group_then_batch_whitening():
    scores = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    groups = ["a", "a", "a", "b", "b", "c", "c", "d"]  # b: zero variance, d: a group of one
    mask = [
        [1, 1, 0, 1],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [0, 1, 1, 1],
        [1, 1, 1, 1],
    ]
    rewards = torch.zeros(8, 4)
    rewards[:, -1] = torch.tensor(scores)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.tensor(mask, dtype=torch.float32)},
        non_tensors={"uid": np.array(groups, dtype=object)},
    )
    out = compute_advantage(data, adv_estimator=WHITEN_ESTIMATOR, config=None)
    want = _group_then_whiten(scores, groups, mask)
    got = out.batch["advantages"].tolist()
    for i in range(8):
        assert got[i] == pytest.approx(want[i], abs=1e-5), i
    tokens = [v for row, mrow in zip(got, mask, strict=True) for v, m in zip(row, mrow, strict=True) if m]
    assert abs(sum(tokens) / len(tokens)) < 1e-6  # whitened: mean 0 over the loss tokens
    # unlike group-only GRPO, the zero-variance group b is no longer at 0 (whitening moves it)
    assert abs(got[3][0]) > 1e-3


def test_a_split_session_counts_once_in_its_group_and_every_output_is_whitened():
    # keys {uid}_{session}_{index}: session 0 of prompt u has two outputs (a compaction made two lineages)
    keys = ["u_0_0", "u_0_1", "u_1_0", "u_2_0"]
    scores = [1.0, 1.0, 0.0, 1.0]  # the agent loop gives both outputs of session 0 the session's reward
    mask = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor(scores)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.tensor(mask, dtype=torch.float32)},
        non_tensors={"uid": np.array(["u"] * 4, dtype=object)},
    )
    out = va.compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator=WHITEN_ESTIMATOR)
    # the group statistics see 3 sessions (1, 0, 1), not 4 outputs
    m = 2 / 3
    sd = math.sqrt(((1 - m) ** 2 * 2 + m**2) / 2)
    per_session = [(1 - m) / (sd + EPS), -m / (sd + EPS), (1 - m) / (sd + EPS)]
    per_row = [per_session[0], per_session[0], per_session[1], per_session[2]]
    toks = [per_row[i] for i, row in enumerate(mask) for x in row if x]
    mu = sum(toks) / len(toks)
    scale = math.sqrt(sum((v - mu) ** 2 for v in toks) / (len(toks) - 1) + 1e-8)
    got = out.batch["advantages"].tolist()
    for i, row in enumerate(mask):
        assert got[i] == pytest.approx([(per_row[i] - mu) / scale if x else 0.0 for x in row], abs=1e-5)
    assert va.final_rows(keys) == [1, 1, 2, 3]
    with pytest.raises(ValueError, match="not verl's"):
        va.final_rows(["no-index"])


def test_the_launch_script_loads_the_estimator_only_when_whitening_is_on():
    def script(whiten_on, env=None):
        r = Recipe(engine="verl", batch_whiten=whiten_on, parallel=Parallel(nodes=1, gpus_per_node=8))
        return launch_script(r, [], python="python", ray_port=6379, log_dir="/l", env=env)

    assert f"export VERL_USE_EXTERNAL_MODULES={WHITEN_MODULE}\n" in script(True)
    assert "VERL_USE_EXTERNAL_MODULES" not in script(False)
    mine = script(True, env={"VERL_USE_EXTERNAL_MODULES": "my.plugin"})
    assert f"export VERL_USE_EXTERNAL_MODULES=my.plugin,{WHITEN_MODULE}\n" in mine


def test_whitening_over_processes_uses_the_whole_batchs_statistics():
    """Two "processes" (threads) whiten their shards with an all-reduce that sums over both, as the TRL
    engine does with accelerate's reduce: the result is the whole batch's whitening."""
    torch.manual_seed(0)
    values = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).to(torch.float32)
    shards = [(values[:2], mask[:2]), (values[2:], mask[2:])]
    barrier = threading.Barrier(2)
    slots: list = [None, None]

    def all_reduce_of(rank):
        def all_reduce(t):
            slots[rank] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        return all_reduce

    parts: list = [None, None]

    def run(rank):
        parts[rank] = whiten(*shards[rank], all_reduce=all_reduce_of(rank))

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert torch.allclose(torch.cat(parts), whiten(values, mask), atol=1e-6)
    assert not torch.allclose(parts[0], whiten(*shards[0]), atol=1e-3)  # a shard alone differs
