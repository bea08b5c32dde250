"""The loss and advantages of the TRL engine as it is configured: the real SweflowGRPOTrainer on the tiny
model, its `_compute_loss` on hand-made inputs, against numbers computed here from the formulas.

The old / rollout / reference logprobs are the model's own per-token logprobs (a plain forward + log_softmax
+ gather written here) shifted by chosen offsets, so each token's PPO ratio, TIS weight (above and below
the cap) and KL term are known; the expected loss is then evaluated in plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from sweflow.errors import ConfigError  # noqa: E402
from sweflow.train.recipe import Optim, Parallel, Recipe, check_recipe  # noqa: E402

CLIP_LOW, CLIP_HIGH, CAP, KL_COEF, EPS = 0.2, 0.28, 2.0, 0.001, 1e-6

# B = 4 samples (one micro-batch), prompt P = 5 (sample 1 left-padded by 2), completion C = 7.
P, C = 5, 7
PROMPT_MASK = [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
COMPLETION_MASK = [[1] * 7, [1] * 7, [1, 1, 1, 1, 0, 0, 0], [1] * 7]  # sample 2: 4 tokens, then padding
TOOL_MASK = [[1, 1, 0, 0, 0, 1, 1], [1] * 7, [1] * 7, [1, 1, 1, 1, 1, 0, 1]]  # tool output mid-sample
LOSS_MASK = [
    [c * t for c, t in zip(cr, tr, strict=True)] for cr, tr in zip(COMPLETION_MASK, TOOL_MASK, strict=True)
]
ADVANTAGES = [1.0, -0.7, 2.0, -1.5]
# ratio pi/pi_old, raw TIS weight exp(old - rollout), and d = ref - logp for each completion token
RATIO = [
    [1.1, 1.5, 9.0, 0.1, 3.0, 0.7, 1.25],  # positive A: 1.5 clipped, 0.7 / 1.25 / 1.1 not
    [0.5, 0.9, 1.35, 0.75, 1.0, 1.2, 2.0],  # negative A: 0.5 and 0.75 clipped; 2.0 not (no cap for A < 0)
    [1.3, 1.0, 0.6, 1.2, 5.0, 5.0, 5.0],  # padding (positions 4-6) carries absurd values
    [0.85, 1.1, 0.78, 1.4, 1.0, 7.0, 0.95],
]
TIS_RAW = [
    [1.0, 3.0, 8.0, 8.0, 8.0, 0.5, 2.5],  # 3.0 and 2.5 above the cap (count 2)
    [1.2, 0.3, 1.0, 4.0, 1.9, 1.0, 0.8],
    [2.2, 1.0, 0.9, 1.0, 9.0, 9.0, 9.0],
    [1.0, 1.0, 6.0, 1.0, 0.6, 9.0, 1.0],
]
DREF = [
    [0.1, -0.3, 5.0, 5.0, 5.0, 0.2, 0.0],
    [0.05, 0.0, -0.1, 0.3, 3.5, 0.0, -0.4],  # 3.5: e^3.5 - 4.5 = 28.6, the clamp at 10 binds
    [0.2, -0.2, 0.0, 0.1, 6.0, 6.0, 6.0],
    [0.0, 0.4, 0.0, -1.0, 0.0, 4.0, 0.3],
]


# ------------------------------------------------------------------------------------- formulas
def ref_clip(ratio, adv):
    return max(-adv * ratio, -adv * min(max(ratio, 1 - CLIP_LOW), 1 + CLIP_HIGH))


def ref_k3(logp, ref):
    d = ref - logp
    return min(max(math.exp(d) - 1 - d, -10.0), 10.0)


def ref_per_sample_mean(rows, mask_rows):
    per = []
    for row, mrow in zip(rows, mask_rows, strict=True):
        n = sum(mrow)
        per.append(sum(v for v, m in zip(row, mrow, strict=True) if m) / n if n else 0.0)
    return sum(per) / len(per)


def ref_token_mean(rows, mask_rows):
    vals = [v for row, mrow in zip(rows, mask_rows, strict=True) for v, m in zip(row, mrow, strict=True) if m]
    return sum(vals) / len(vals)


def reference(logp, old, rollout, ref, adv, mask):
    """(loss, stats) of the recipe's loss from plain lists."""
    pg, kl, w, over, clipped = [], [], [], [], []
    for b in range(len(logp)):
        rows = ([], [], [], [], [])
        for j in range(len(logp[b])):
            r = math.exp(logp[b][j] - old[b][j])
            raw = math.exp(old[b][j] - rollout[b][j])
            wt = min(max(raw, 0.0), CAP)
            rows[0].append(ref_clip(r, adv[b]) * wt)
            rows[1].append(ref_k3(logp[b][j], ref[b][j]))
            rows[2].append(wt)
            rows[3].append(1.0 if raw > CAP else 0.0)
            rows[4].append(
                1.0 if (adv[b] > 0 and r > 1 + CLIP_HIGH) or (adv[b] < 0 and r < 1 - CLIP_LOW) else 0.0
            )
        for acc, row in zip((pg, kl, w, over, clipped), rows, strict=True):
            acc.append(row)
    policy, kl_mean = ref_per_sample_mean(pg, mask), ref_per_sample_mean(kl, mask)
    return policy + KL_COEF * kl_mean, {
        "policy_loss": policy,
        "kl": kl_mean,
        "clip_fraction": ref_token_mean(clipped, mask),
        "tis_weight_mean": ref_token_mean(w, mask),
        "tis_clipped_share": ref_token_mean(over, mask),
    }


# ------------------------------------------------------------------------------------- the trainer
class NoRollouts:
    """The rollouts factory's product: these tests call the loss and advantages directly, never run()."""

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, jobs, prefix=""):
        raise AssertionError("not used here")


def _small_recipe(**kw):
    base = dict(
        engine="trl",
        run="loss",
        prompts_per_step=2,
        samples_per_prompt=4,
        global_batch=8,
        micro_batch=4,
        total_steps=2,
        save_every=1,
        optim=Optim(lr=1e-3, weight_decay=0.0),
        max_response_tokens=64,
        max_concurrency=1,
    )
    base.update(kw)
    r = Recipe(**base)
    check_recipe(r)
    return r


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from sweflow.offline.tiny_model import tiny_model_path
    from sweflow.train.trl_engine import _trainer_class, grpo_args

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = tmp_path_factory.mktemp("trl-loss")
    model_dir = tiny_model_path()
    recipe = _small_recipe()
    args = grpo_args(recipe, out / "checkpoints")
    args.model_init_kwargs = {"dtype": torch.float32}
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "x"}], "sweflow_row": json.dumps({"i": i})}
            for i in range(2)
        ]
    )
    torch.manual_seed(0)
    tr = _trainer_class()(
        model=str(model_dir),
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
        recipe=recipe,
        rollouts_factory=NoRollouts,
        out_dir=out,
    )
    assert isinstance(tr.rollouts, NoRollouts) and tr.rollouts.engine is tr.policy_engine
    return tr


def own_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Per-token logprobs of the completion under `model`: a plain forward, log_softmax, gather."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    att = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits.double()
    logp = torch.log_softmax(logits[:, P - 1 : -1], dim=-1)  # position k predicts token k + 1
    return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def make_inputs(trainer):
    g = torch.Generator().manual_seed(7)
    vocab = trainer.model.config.vocab_size
    prompt_ids = torch.randint(10, vocab, (4, P), generator=g)
    completion_ids = torch.randint(10, vocab, (4, C), generator=g)
    pm, cm = torch.tensor(PROMPT_MASK), torch.tensor(COMPLETION_MASK)
    lp = own_logps(trainer.model, prompt_ids, pm, completion_ids, cm)
    log_r, log_w = (torch.tensor(x, dtype=torch.float64).log() for x in (RATIO, TIS_RAW))
    d = torch.tensor(DREF, dtype=torch.float64)
    old = lp - log_r  # ratio = exp(logp - old)
    rollout = old - log_w  # raw TIS weight = exp(old - rollout)
    ref = lp + d
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": pm,
        "completion_ids": completion_ids,
        "completion_mask": cm,
        "tool_mask": torch.tensor(TOOL_MASK),
        "advantages": torch.tensor(ADVANTAGES, dtype=torch.float32),
        "old_per_token_logps": old.float(),
        "sampling_per_token_logps": rollout.float(),
        "ref_per_token_logps": ref.float(),
    }
    lists = {"logp": lp.tolist(), "old": old.float().double().tolist()}
    lists["rollout"] = rollout.float().double().tolist()
    lists["ref"] = ref.float().double().tolist()
    return inputs, lists


def expected(lists):
    return reference(lists["logp"], lists["old"], lists["rollout"], lists["ref"], ADVANTAGES, LOSS_MASK)


def test_the_hand_made_inputs_exercise_every_branch(trainer):
    _, lists = make_inputs(trainer)
    _, stats = expected(lists)
    assert 0 < stats["clip_fraction"] < 1 and 0 < stats["tis_clipped_share"] < 1
    assert LOSS_MASK[1][4] and ref_k3(lists["logp"][1][4], lists["ref"][1][4]) == 10.0  # KL clamp binds
    # the trainer's own logprob path agrees with the plain forward written here
    inputs, _ = make_inputs(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, C)
    on = inputs["completion_mask"].bool()  # TRL scores padding as 0
    assert torch.allclose(lp.double()[on], torch.tensor(lists["logp"], dtype=torch.float64)[on], atol=1e-5)


def test_compute_loss_in_eval_mode_is_the_formula_value_with_its_stats(trainer):
    trainer.model.eval()
    inputs, lists = make_inputs(trainer)
    trainer._loss_stats.clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    want, want_stats = expected(lists)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    got = trainer._loss_stats[-1]
    for k, v in want_stats.items():
        assert got[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # the weights matter: a loss without TIS, or with TRL's token mean, or with the KL weighed by the
    # ratio would differ from this value
    no_tis = reference(lists["logp"], lists["old"], lists["old"], lists["ref"], ADVANTAGES, LOSS_MASK)[
        0
    ]  # rollout = old: every weight 1
    assert abs(want - no_tis) > 1e-2


def test_compute_loss_in_train_mode_is_divided_by_the_accumulation_steps_once(trainer):
    inputs, lists = make_inputs(trainer)
    want, _ = expected(lists)
    steps = trainer.args.gradient_accumulation_steps
    assert steps == 2  # 8 samples per update in micro-batches of 4
    trainer.model.train()
    try:
        trainer.current_gradient_accumulation_steps = steps  # what Trainer's loop sets for a full window
        loss = trainer._compute_loss(trainer.model, inputs)
        assert float(loss.detach()) * steps == pytest.approx(want, rel=1e-5)
        loss.backward()  # the loss has a gradient path to the weights
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        assert grads and any(float(gr.abs().sum()) > 0 for gr in grads)
    finally:
        trainer.model.zero_grad(set_to_none=True)
        trainer.model.eval()
    # ... and Trainer.training_step does not divide it again: TRL marks its loss as already scaled
    # (transformers < 5.19 reads model_accepts_loss_kwargs / compute_loss_func for that)
    assert type(trainer).loss_is_scaled_for_ga is True
    assert trainer.compute_loss_func is not None and trainer.model_accepts_loss_kwargs is False


def test_masked_tool_and_padding_tokens_do_not_change_the_loss(trainer):
    trainer.model.eval()
    inputs, _ = make_inputs(trainer)
    base = float(trainer._compute_loss(trainer.model, inputs).detach())
    changed = {k: v.clone() for k, v in inputs.items()}
    for b, j in [(0, 2), (0, 3), (0, 4), (3, 5), (2, 5)]:  # tool output and padding positions
        assert LOSS_MASK[b][j] == 0
        changed["old_per_token_logps"][b, j] = -40.0
        changed["sampling_per_token_logps"][b, j] = 3.0
        changed["ref_per_token_logps"][b, j] = 5.0
    assert float(trainer._compute_loss(trainer.model, changed).detach()) == pytest.approx(base, rel=1e-6)
    # while a loss token's value does change it
    changed["old_per_token_logps"][0, 0] -= 0.5
    assert float(trainer._compute_loss(trainer.model, changed).detach()) != pytest.approx(base, rel=1e-4)


def test_compute_loss_without_old_logps_is_on_policy(trainer):
    """When generation and updates are aligned TRL passes no old logprobs: ratio 1, TIS from the current
    policy over the rollout logprobs."""
    trainer.model.eval()
    inputs, lists = make_inputs(trainer)
    inputs.pop("old_per_token_logps")
    loss = trainer._compute_loss(trainer.model, inputs)
    want, _ = reference(lists["logp"], lists["logp"], lists["rollout"], lists["ref"], ADVANTAGES, LOSS_MASK)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)


# ------------------------------------------------------------------------------------- advantages
def _out():
    cm = torch.ones(8, 5, dtype=torch.int64)
    cm[6, 3:] = 0
    tool = torch.ones(8, 5, dtype=torch.int64)
    tool[1, 1:3] = 0
    return {"completion_mask": cm, "tool_mask": tool}


VALID = [True, True, False, True, True, False, False, True]  # group 1 keeps two valid samples
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0]


def _group_reference():
    adv = [0.0] * 8
    for g in (0, 1):
        idx = [i for i in range(4 * g, 4 * g + 4) if VALID[i]]
        vals = [REWARDS[i] for i in idx]
        m = sum(vals) / len(vals)
        s = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            adv[i] = (REWARDS[i] - m) / (s + EPS)
    return adv


def test_sweflow_advantages_are_group_advantages_over_valid_samples(trainer):
    """Group-only (advantage.batch_whiten false); the default whitens after this (the next test)."""
    trainer._valid, trainer._rewards = list(VALID), list(REWARDS)
    out = _out()
    before = out["completion_mask"].clone()
    recipe = trainer.recipe
    trainer.recipe = dataclasses.replace(recipe, batch_whiten=False)
    try:
        res = trainer._sweflow_advantages(out)
    finally:
        trainer.recipe = recipe
    adv = res["advantages"].tolist()
    want = _group_reference()
    assert adv == pytest.approx(want, rel=1e-6, abs=1e-7)
    # group 0: [1, 0, 1] valid -> mean 2/3, std sqrt(1/3); group 1: [0.5, 0.0]
    assert adv[0] == pytest.approx((1 / 3) / (math.sqrt(1 / 3) + EPS), rel=1e-6)
    assert adv[4] == pytest.approx(0.25 / (math.sqrt(0.125) + EPS), rel=1e-6)
    assert adv[2] == adv[5] == adv[6] == 0.0
    # aborted samples lose every loss token; the others keep theirs
    cm = res["completion_mask"]
    for i in range(8):
        if VALID[i]:
            assert torch.equal(cm[i], before[i])
        else:
            assert int(cm[i].sum()) == 0


def test_sweflow_advantages_with_batch_whitening_whiten_over_the_loss_tokens(trainer):
    trainer._valid, trainer._rewards = list(VALID), list(REWARDS)
    recipe = trainer.recipe
    trainer.recipe = dataclasses.replace(recipe, batch_whiten=True)
    try:
        res = trainer._sweflow_advantages(_out())
    finally:
        trainer.recipe = recipe
    group = _group_reference()
    out = _out()
    mask = [
        [
            int(c) * int(t) * int(VALID[i])
            for c, t in zip(out["completion_mask"][i], out["tool_mask"][i], strict=True)
        ]
        for i in range(8)
    ]
    toks = [group[i] for i in range(8) for j in range(5) if mask[i][j]]
    mu = sum(toks) / len(toks)
    sd = math.sqrt(sum((v - mu) ** 2 for v in toks) / (len(toks) - 1) + 1e-8)
    got = res["advantages"].tolist()
    for i in range(8):
        for j in range(5):
            want = (group[i] - mu) / sd if mask[i][j] else 0.0
            assert got[i][j] == pytest.approx(want, rel=1e-5, abs=1e-6), (i, j)


# ------------------------------------------------------------------------------------- the config
@pytest.fixture
def bf16_gpu(monkeypatch):
    """Let transformers accept bf16 on this CPU-only machine (the production recipe asks for GPUs)."""
    import transformers.training_args as ta

    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda *a, **k: True)


def test_grpo_args_of_the_production_recipe(tmp_path, bf16_gpu):
    from sweflow.train.trl_engine import grpo_args

    r = Recipe(parallel=Parallel(gpus_per_node=1))
    check_recipe(r)
    assert (r.prompts_per_step, r.samples_per_prompt, r.global_batch, r.updates_per_step) == (8, 16, 128, 1)
    a = grpo_args(r, tmp_path)
    assert a.num_generations == 16
    assert a.loss_type == "grpo" and a.scale_rewards == "group"
    assert a.beta == 0.001 and a.epsilon == 0.2 and a.epsilon_high == 0.28
    assert a.learning_rate == 1e-6 and (a.adam_beta1, a.adam_beta2) == (0.9, 0.98) and a.weight_decay == 0.1
    assert a.max_grad_norm == 1.0
    assert a.temperature == 1.0 and a.top_p == 1.0 and a.top_k == 0
    assert a.max_steps == 500 and a.num_iterations == 1
    assert a.bf16 and not a.use_cpu
    # one rollout step = one generation of 8 prompts x 16 = one optimizer update of 128 samples
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == 128
    assert a.per_device_train_batch_size * a.steps_per_generation == 128
    assert a.generation_batch_size == 128
    assert a.gradient_accumulation_steps % (a.steps_per_generation * a.num_iterations) == 0  # aligned
    assert a.save_steps == r.save_every


def test_grpo_args_split_a_step_over_devices(tmp_path, bf16_gpu):
    from sweflow.train.trl_engine import grpo_args

    r = Recipe(parallel=Parallel(gpus_per_node=8), micro_batch=2)
    check_recipe(r)
    a = grpo_args(r, tmp_path, world_size=8)
    assert a.per_device_train_batch_size == 2
    assert a.gradient_accumulation_steps * 2 * 8 == r.global_batch == 128
    assert a.steps_per_generation * 2 * 8 == r.samples_per_step == 128


def test_grpo_args_two_updates_per_step(tmp_path):
    from sweflow.train.trl_engine import grpo_args

    r = _small_recipe(global_batch=4, total_steps=3, save_every=2)
    assert r.updates_per_step == 2
    a = grpo_args(r, tmp_path)
    assert a.gradient_accumulation_steps * a.per_device_train_batch_size == 4
    assert a.steps_per_generation * a.per_device_train_batch_size == 8
    assert a.max_steps == 6 and a.save_steps == 4


@pytest.mark.parametrize(
    ("field", "parallel"), [("context", Parallel(context=2)), ("tensor", Parallel(tensor=2))]
)
def test_check_recipe_rejects_model_parallelism_on_trl(field, parallel):
    p = dataclasses.replace(parallel, gpus_per_node=2)
    with pytest.raises(ConfigError) as err:
        check_recipe(Recipe(engine="trl", parallel=p))
    msg = str(err.value)
    assert "\n" not in msg
    assert f"train.parallel.{field}" in msg
    check_recipe(Recipe(engine="verl", parallel=p))  # verl can
