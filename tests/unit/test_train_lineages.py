"""Every lineage of a split session is trained on TRL, as on verl (issue 26, item 6).

A session the proxy split (compaction, a rewritten history) gives several samples; GRPO's group sees the
session once (its reward), but every lineage's model tokens carry the session's advantage into the loss,
each weighed as one row, and batch whitening takes every lineage's loss tokens.
"""

from __future__ import annotations

import json

import pytest

from sweflow.rollout.types import RolloutResult
from sweflow.train.rollouts import completion_of, lineage_of, sample_record

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


def _sample(prompt, completion, mask=None, lps=None):
    mask = mask if mask is not None else [1] * len(completion)
    lps = lps if lps is not None else [-0.5] * len(completion)
    return {
        "token_ids": prompt + completion,
        "loss_mask": [0] * len(prompt) + mask,
        "rollout_logprobs": [0.0] * len(prompt) + lps,
        "prompt_length": len(prompt),
    }


def _result(samples, reward=1.0, group=0, iid="t-0"):
    return RolloutResult(iid, group, f"{iid}:{group}", "completed", None, reward=reward, samples=samples)


def test_the_last_lineage_leads_and_the_earlier_ones_ride_along():
    early = _sample([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1])
    tool_only = _sample([1, 2], [9, 9], [0, 0])  # no model token: nothing to train
    last = _sample([1, 8], [10, 11, 12])
    c = completion_of(_result([early, tool_only, last]), max_context_tokens=100, pad_id=0)
    assert c.valid and c.segments == 3
    assert (c.prompt_ids, c.completion_ids, c.env_mask) == ([1, 8], [10, 11, 12], [1, 1, 1])
    assert [(x.prompt_ids, x.completion_ids, x.env_mask) for x in c.extras] == [
        ([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1])
    ]
    rec = sample_record(_result([early, tool_only, last]), step=1, group=0, completion=c)
    assert rec["trained_lineages"] == 2 and rec["trained_tokens"] == 3 + 3
    # an aborted session trains nothing, not even its earlier lineages
    dead = RolloutResult("t-0", 0, "t-0:0", "aborted", "sandbox_died", samples=[early, last])
    c = completion_of(dead, max_context_tokens=100, pad_id=0)
    assert not c.valid and c.extras == []
    assert sample_record(dead, step=1, group=0, completion=c)["trained_lineages"] == 0


def test_each_lineage_is_cut_to_the_context_on_its_own():
    x = lineage_of(_sample([1] * 6, [2] * 10), max_context_tokens=10)
    assert len(x.prompt_ids) + len(x.completion_ids) == 10 and x.truncated
    assert lineage_of(_sample([1] * 10, [2] * 3), max_context_tokens=10) is None  # no room after the prompt
    c = completion_of(
        _result([_sample([1] * 6, [2] * 10), _sample([3], [4, 5])]), max_context_tokens=10, pad_id=0
    )
    rec = sample_record(_result([]), step=1, group=0, completion=c)
    assert c.extras[0].truncated and rec["truncated"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    import datasets

    from sweflow.offline.tiny_model import tiny_model_path
    from sweflow.train.recipe import Optim, Recipe, check_recipe
    from sweflow.train.trl_engine import _trainer_class, grpo_args

    recipe = Recipe(
        engine="trl", run="lineages", prompts_per_step=2, samples_per_prompt=4, global_batch=8,
        micro_batch=4, total_steps=1, save_every=1, optim=Optim(lr=1e-2, weight_decay=0.0),
        kl_coef=0.001, max_response_tokens=16, max_concurrency=1,
    )  # fmt: skip
    check_recipe(recipe)
    tmp = tmp_path_factory.mktemp("lineages")
    rows = [
        {"prompt": [{"role": "user", "content": f"t{i}"}], "metadata": {"instance_id": f"t-{i}"}}
        for i in (0, 1)
    ]
    return _trainer_class()(
        model=str(tiny_model_path()),
        args=grpo_args(recipe, tmp),
        train_dataset=datasets.Dataset.from_list([{"prompt": r["prompt"], "sweflow_row": json.dumps(r)} for r in rows]),
        recipe=recipe,
        rollouts_factory=lambda engine: None,
        out_dir=tmp,
    )  # fmt: skip


def _split_step(trainer):
    """8 sessions in 2 groups; sessions 0 and 5 were split in two lineages; session 6 aborted."""
    from sweflow.train.rollouts import Lineage

    trainer._valid = [True, True, True, True, True, True, False, True]
    trainer._rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    early = Lineage([5, 6, 7], [8, 9, 10, 11], [-1.0] * 4, [1, 0, 1, 1], False)
    trainer._extras = [[early], [], [], [], [], [early], [], []]
    return trainer._sweflow_advantages({"completion_mask": torch.ones(8, 3, dtype=torch.long)})


def test_every_lineage_weighs_as_one_row_and_is_whitened_with_the_batch(trainer):
    from sweflow.train.algos import group_advantages, whiten

    out = _split_step(trainer)
    # 7 valid sessions + 2 earlier lineages = 9 rows for the 8 samples of the step
    w = out["sweflow_sample_weight"].tolist()
    assert w == pytest.approx([8 / 9] * 6 + [0.0, 8 / 9])
    extra = out["sweflow_extra"]
    assert [len(x) for x in extra] == [1, 0, 0, 0, 0, 1, 0, 0]
    assert extra[0][0]["weight"] == pytest.approx(8 / 9)
    # the whitening statistics count the earlier lineages' 3 loss tokens each, at their session's advantage
    raw = group_advantages(trainer._rewards, [i // 4 for i in range(8)], trainer._valid, norm_by_std=True)
    values = (
        [a for i, a in enumerate(raw) for _ in range(3 * trainer._valid[i])] + [raw[0]] * 3 + [raw[5]] * 3
    )
    want = whiten(torch.tensor(values), torch.ones(len(values)))
    assert float(out["advantages"][0, 0]) == pytest.approx(float(want[0]), abs=1e-5)
    assert extra[0][0]["advantage"] == pytest.approx(float(want[-6]), abs=1e-5)
    assert extra[5][0]["advantage"] == pytest.approx(float(want[-1]), abs=1e-5)
    assert extra[0][0]["advantage"] > 0 > extra[5][0]["advantage"]  # rewarded vs not, in the same group
    assert extra[0][0]["ref"] is not None and len(extra[0][0]["ref"]) == 4  # the KL term is on


def test_an_earlier_lineage_gets_its_gradient(trainer):
    out = _split_step(trainer)
    batch = {
        "prompt_ids": torch.tensor([[1, 2]] * 4),
        "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[3, 4, 5]] * 4),
        "completion_mask": torch.zeros(4, 3, dtype=torch.long),  # no loss token of the final lineages
        "advantages": out["advantages"][:4],
        "sweflow_sample_weight": out["sweflow_sample_weight"][:4],
    }
    model = trainer.model
    model.zero_grad()
    alone = trainer._compute_loss(model, dict(batch))
    assert float(alone) == 0.0
    loss = trainer._compute_loss(model, dict(batch, sweflow_extra=out["sweflow_extra"][:4]))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert float(loss) != 0.0 and grads and any(float(g.abs().sum()) > 0 for g in grads)
    # the extra lineage's term is its own loss, weighed as one row of the micro-batch of 4
    one, _ = trainer._lineage_loss(model, out["sweflow_extra"][0][0])
    accum = trainer.current_gradient_accumulation_steps if model.training else 1
    assert float(loss) == pytest.approx(float(one) / 4 / accum, rel=1e-4)
    model.zero_grad()
