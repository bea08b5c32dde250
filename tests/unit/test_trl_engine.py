"""The TRL engine trains for real on CPU: GRPOTrainer + sweflow's rollout function, advantages and loss.

The rollouts here are a toy environment (no sandbox): the live policy samples a few tokens for a fixed
prompt through the same engine the proxy would call, and the reward is the share of sampled tokens in a
target set, so only learning raises it.
"""

from __future__ import annotations

import json

import pytest

from sweflow.proxy.engines import SamplingParams
from sweflow.rollout.types import RolloutResult
from sweflow.train.recipe import Optim, Recipe, check_recipe

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

K = 6  # tokens per toy completion


class ToyRollouts:
    """Samples K tokens from the live policy; reward = share of them in `target`; `abort` group indices abort."""

    def __init__(self, engine, prompt_ids, target, abort=(), split=False):
        self.engine, self.prompt_ids, self.target, self.abort = engine, prompt_ids, set(target), set(abort)
        self.split = split  # every session in two lineages: its first half, then a compacted second half
        self.calls = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, jobs, prefix=""):
        out = []
        for row, g in jobs:
            iid = row["metadata"]["instance_id"]
            self.calls.append((iid, g))
            if g in self.abort:
                out.append(RolloutResult(iid, g, f"{prefix}{iid}:{g}", "aborted", "sandbox_died"))
                continue
            # the session id the proxy would pass: the live engine seeds each draw from it (reproducible)
            sp = SamplingParams(max_tokens=K, temperature=1.0, request_id=f"{prefix}{iid}:{g}:0")
            res = self.engine.generate(self.prompt_ids, sp)
            reward = sum(t in self.target for t in res.output_ids) / K
            p = len(self.prompt_ids)
            sample = {
                "token_ids": self.prompt_ids + res.output_ids,
                "loss_mask": [0] * p + [1] * K,
                "rollout_logprobs": [0.0] * p + res.logprobs,
                "prompt_length": p,
            }
            samples = [sample]
            if self.split:
                h = K // 2
                first = {k: v[: p + h] for k, v in sample.items() if k != "prompt_length"}
                second = {
                    "token_ids": self.prompt_ids[:1] + res.output_ids[h:],
                    "loss_mask": [0] + [1] * (K - h),
                    "rollout_logprobs": [0.0] + res.logprobs[h:],
                    "prompt_length": 1,
                }
                samples = [dict(first, prompt_length=p), second]
            out.append(
                RolloutResult(
                    iid,
                    g,
                    f"{prefix}{iid}:{g}",
                    "completed",
                    None,
                    reward=reward,
                    samples=samples,
                    num_turns=1,
                )
            )
        return out


def _rows(n):
    return [
        {"prompt": [{"role": "user", "content": f"task {i}"}], "metadata": {"instance_id": f"toy-{i}"}}
        for i in range(n)
    ]


def _recipe(**kw):
    base = dict(
        engine="trl",
        run="toy",
        prompts_per_step=2,
        samples_per_prompt=4,
        global_batch=8,
        micro_batch=4,
        total_steps=16,
        save_every=8,
        optim=Optim(lr=2e-2, weight_decay=0.0),
        kl_coef=0.001,
        max_response_tokens=64,
        max_concurrency=1,
    )
    base.update(kw)
    r = Recipe(**base)
    check_recipe(r)
    return r


@pytest.fixture(scope="module")
def tiny_model_dir():
    from sweflow.offline.tiny_model import tiny_model_path

    return tiny_model_path()


def _train(tmp_path, model_dir, recipe, abort=(), split=False):
    from transformers import AutoTokenizer

    from sweflow.train.trl_engine import train_trl

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompt_ids = tok.encode("Say something:")
    target = range(40, 140)  # ~15% of the vocabulary
    made = {}

    def factory(engine):
        made["r"] = ToyRollouts(engine, prompt_ids, target, abort, split)
        return made["r"]

    torch.manual_seed(0)
    summary = train_trl(
        recipe, rows=_rows(2), model_dir=model_dir, out_dir=tmp_path, rollouts_factory=factory
    )
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics, made["r"]


@pytest.mark.parametrize("seed", [1, 2])
def test_trl_engine_learns_the_toy_reward(tmp_path, tiny_model_dir, seed):
    summary, metrics, toy = _train(
        tmp_path, tiny_model_dir, _recipe(seed=seed, total_steps=20, save_every=10)
    )
    assert summary["steps"] == 20 and len(metrics) == 20
    rewards = [m["reward_mean"] for m in metrics]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.2, rewards
    # every step sampled prompts x n from the live policy, in whole groups
    assert len(toy.calls) == 20 * 8
    for m in metrics:
        assert m["samples"] == m["completed"] + m["aborted"] == 8
        assert m["groups"] == m["groups_with_gradient"] + m["groups_without_gradient"] == 2
        assert m["kl"] is not None and m["tis_weight_mean"] is not None and m["grad_norm"] is not None
    assert (tmp_path / "final" / "config.json").exists()
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir())[:2] == ["step-1.jsonl", "step-10.jsonl"]
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*"))) == 2  # save_every 10


def test_aborted_samples_are_dropped_not_scored_zero(tmp_path, tiny_model_dir):
    # group indices 0 and 1 abort in every group: each group keeps 2 valid samples
    _, metrics, _ = _train(tmp_path, tiny_model_dir, _recipe(total_steps=2, save_every=2), abort=(0, 1))
    for m in metrics:
        assert m["aborted"] == 4 and m["aborted_by_reason"] == {"sandbox_died": 4}
        assert m["trained_samples"] == 4
    rec = [json.loads(x) for x in (tmp_path / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    assert sum(r["aborted"] for r in rec) == 4
    assert all(r["reward"] is None and not r["trained"] for r in rec if r["aborted"])


def test_split_sessions_train_every_lineage_through_the_trainer(tmp_path, tiny_model_dir):
    """TRL shuffles and splits the step's batch into micro-batches: the earlier lineages go with their
    sessions, and each update counts them (16 lineages for the 8 sessions of a step)."""
    _, metrics, _ = _train(tmp_path, tiny_model_dir, _recipe(total_steps=2, save_every=2), split=True)
    assert [m["trained_lineages"] for m in metrics] == [16, 16]
    assert all(m["trained_samples"] == 8 and m["grad_norm"] is not None for m in metrics)
    rec = [json.loads(x) for x in (tmp_path / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    assert all(r["trained_lineages"] == 2 and r["trained_tokens"] == K for r in rec)


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, tiny_model_dir):
    first, metrics, _ = _train(tmp_path, tiny_model_dir, _recipe(total_steps=2, save_every=1))
    assert first["resumed_from_step"] is None and [m["step"] for m in metrics] == [1, 2]
    # the same run asked for more steps (the checkpoints of steps 1 and 2 are in place)
    again, metrics, toy = _train(tmp_path, tiny_model_dir, _recipe(total_steps=3, save_every=1))
    assert again["resumed_from_step"] == 2 and again["steps"] == 3
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert len(toy.calls) == 8  # only step 3 sampled


def test_aborted_samples_do_not_shrink_the_update(tmp_path, tiny_model_dir):
    import torch

    from sweflow.train.trl_engine import _trainer_class, grpo_args

    recipe = _recipe(total_steps=1, save_every=1)
    trainer = _trainer_class()(
        model=str(tiny_model_dir),
        args=grpo_args(recipe, tmp_path),
        train_dataset=__import__("datasets").Dataset.from_list(
            [{"prompt": r["prompt"], "sweflow_row": json.dumps(r)} for r in _rows(2)]
        ),
        recipe=recipe,
        rollouts_factory=lambda engine: ToyRollouts(engine, [1, 2, 3], range(10)),
        out_dir=tmp_path,
    )
    trainer._valid = [True, False, True, True, True, True, False, True]
    trainer._rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    out = trainer._sweflow_advantages({"completion_mask": torch.ones(8, 3, dtype=torch.long)})
    w = out["sweflow_sample_weight"]
    assert w.tolist() == pytest.approx([8 / 6, 0, 8 / 6, 8 / 6, 8 / 6, 8 / 6, 0, 8 / 6])
    assert out["completion_mask"][1].sum() == 0 and out["completion_mask"][6].sum() == 0
    # a per-sample mean weighted so is the mean over the valid samples
    from sweflow.train.algos import per_sample_mean

    values = torch.arange(24, dtype=torch.float32).view(8, 3)
    got = per_sample_mean(values, out["completion_mask"], w)
    valid_rows = values[[0, 2, 3, 4, 5, 7]].mean(-1)
    assert float(got) == pytest.approx(float(valid_rows.mean()))


@pytest.mark.slow
def test_data_parallel_ranks_share_each_step_and_end_with_the_same_weights(tmp_path):
    """Two torchrun processes (gloo on CPU): each rolls out its own group of every step, the gradients are
    averaged, and both ranks hold the same, changed weights at the end."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sweflow.offline.tiny_model import build_tiny_model
    from sweflow.util import free_port

    root = Path(__file__).resolve().parents[2]
    model = build_tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(root / "tests" / "fixtures" / "toy_dp.py"), str(out), str(model)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["start"] == ranks[1]["start"]
    assert ranks[0]["end"] == ranks[1]["end"] != ranks[0]["start"]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["samples"] == 8 and m["groups"] == 2 for m in metrics)
    for step in range(3):  # per step, each rank ran one whole group of 4: together both tasks
        mine = [ranks[r]["calls"][4 * step : 4 * step + 4] for r in (0, 1)]
        assert all(len({iid for iid, _ in m}) == 1 and sorted(g for _, g in m) == [0, 1, 2, 3] for m in mine)
        assert {mine[0][0][0], mine[1][0][0]} == {"toy-0", "toy-1"}
    recs = (out / "rollouts" / "step-1.jsonl").read_text().splitlines()
    assert len(recs) == 8  # rank 0 gathered both ranks' records


def test_one_update_follows_the_advantages_not_just_the_weight_decay(tmp_path, tiny_model_dir):
    """The embedded default's optimizer (weight decay 0.1 moves every weight at zero gradient): after one
    update the rewarded completions are likelier and the zero-reward ones less likely than after the same
    update with the advantages zeroed."""
    from sweflow.config import load_config
    from sweflow.train.recipe import Recipe
    from tests.fixtures.grpo_probe import probe

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    recipe = Recipe.from_config(load_config(root / "config" / "config.yaml")["train"])
    assert recipe.optim.weight_decay > 0 and recipe.batch_whiten
    figures = probe(tiny_model_dir, recipe, tmp_path)
    assert figures["rewarded_vs_control"] > 0 > figures["zero_reward_vs_control"], figures
    assert figures["rewarded_control"] != 0.0  # the control moved too (decay, KL): why it is the baseline
