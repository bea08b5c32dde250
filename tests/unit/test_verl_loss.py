"""verl 0.9.1's loss pieces, as sweflow's overrides select them, reproduce the recipe's formulas.

Reference numbers are computed here from the formulas (REFERENCE "Formulas") on hand-made samples, never
taken from verl: group advantages (unbiased std + 1e-6), token TIS clamp(exp(old - rollout), 0, 2), k3 KL
clamped to [-10, 10], PPO clip with the asymmetric high side, and the per-sample mean reduction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from sweflow.train.recipe import Parallel, Recipe  # noqa: E402
from sweflow.train.verl_engine import compose_verl_config, verl_overrides  # noqa: E402

EPS = 1e-6
# Response masks: sample 0 has a tool-output span (positions 2-3) inside its response; sample 2 is short.
MASK = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]


@pytest.fixture(scope="module")
def cfg():
    # verl's own GRPO estimator (group-only); the whitening estimator: test_verl_advantage.py
    recipe = Recipe(
        engine="verl", batch_whiten=False, parallel=Parallel(nodes=4, gpus_per_node=8, tensor=2, context=4)
    )
    return compose_verl_config(
        verl_overrides(
            recipe,
            train_files="/d/train.parquet",
            val_files="/d/val.parquet",
            model_path="/m",
            out_dir="/o",
            agent_loop_config="/o/loops.yaml",
        )
    )


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def mean(xs):
    return sum(xs) / len(xs)


def unbiased_std(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def per_sample_mean(loss_rows, mask_rows):
    """Mean over each sample's loss tokens, then over the samples that have any."""
    per = [
        sum(v for v, m in zip(row, mrow, strict=True) if m) / sum(mrow)
        for row, mrow in zip(loss_rows, mask_rows, strict=True)
        if sum(mrow)
    ]
    return mean(per)


def test_group_advantages_are_normalised_by_the_unbiased_group_std(cfg):
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]  # groups a, a, a, b, b, c, c, d
    uids = np.array(["a", "a", "a", "b", "b", "c", "c", "d"], dtype=object)
    length = 3
    scores = torch.zeros(len(rewards), length)
    scores[:, -1] = torch.tensor(rewards)  # the outcome reward sits on the last response token
    mask = torch.ones(len(rewards), length)
    estimator = core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    adv, _ = estimator(
        token_level_rewards=scores,
        response_mask=mask,
        index=uids,
        norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
    )
    groups: dict[str, list[float]] = {}
    for u, r in zip(uids, rewards, strict=True):
        groups.setdefault(u, []).append(r)
    for i, (u, r) in enumerate(zip(uids, rewards, strict=True)):
        g = groups[u]
        # verl's convention for a group of one: mean 0, std 1 (the lone sample keeps its reward).
        expected = r / (1.0 + EPS) if len(g) == 1 else (r - mean(g)) / (unbiased_std(g) + EPS)
        assert adv[i].tolist() == pytest.approx([expected] * length, abs=1e-6), (i, u)
    assert adv[3:5].abs().max() < 1e-6  # a zero-variance group (b: 1, 1) gets no signal


def test_a_session_split_into_two_outputs_trains_both_with_the_final_outputs_advantage(cfg):
    # Keys {uid}_{session}_{index}: session 0 of prompt u has two outputs (the proxy split it).
    keys = ["u_0_0", "u_0_1", "u_1_0", "u_2_0"]
    rewards = [0.0, 1.0, 0.0, 1.0]  # the agent loop copies the final reward to earlier outputs anyway
    scores = torch.zeros(4, 2)
    scores[:, -1] = torch.tensor(rewards)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": torch.ones(4, 2)},
        non_tensors={"uid": np.array(["u"] * 4, dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=keys,
        adv_estimator=cfg.algorithm.adv_estimator,
        norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
        config=cfg.algorithm,
    )
    finals = [1.0, 0.0, 1.0]  # one score per session: its final output
    expected = [(r - mean(finals)) / (unbiased_std(finals) + EPS) for r in finals]
    adv = out.batch["advantages"][:, 0].tolist()
    assert adv == pytest.approx([expected[0], expected[0], expected[1], expected[2]], abs=1e-6)


def test_token_tis_weights_are_exp_old_minus_rollout_clamped_to_0_2(cfg):
    old = t(
        [[-1.0, -0.5, -2.0, -0.1, -3.0, -0.2], [-0.3, -0.3, -0.3, -0.3, -0.3, -0.3], [-1, -1, -1, 0, 0, 0]]
    )
    rollout = t(
        [[-1.5, -0.4, -0.1, -0.1, -0.5, -2.0], [-0.3, -1.3, -0.1, -5.0, -0.3, 0.0], [-1, -4, -2, 0, 0, 0]]
    )
    data = DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": t(MASK)}
    )
    out, metrics = compute_rollout_correction_and_add_to_batch(data, cfg.algorithm.rollout_correction)
    w = out.batch["rollout_is_weights"]
    for i in range(3):
        for j in range(6):
            expected = min(max(math.exp(old[i, j] - rollout[i, j]), 0.0), 2.0) if MASK[i][j] else 0.0
            assert float(w[i, j]) == pytest.approx(expected, rel=1e-9), (i, j)
    assert out.batch["response_mask"].tolist() == MASK  # no rejection sampling (rollout_rs null)
    live = [(i, j) for i in range(3) for j in range(6) if MASK[i][j]]
    over = sum(1 for i, j in live if math.exp(old[i, j] - rollout[i, j]) > 2.0)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(over / len(live))


def test_low_var_kl_is_k3_of_ref_minus_logp_clamped_to_10(cfg):
    logp = t([[-1.0, -2.0, -0.5, -6.0]])
    ref = t([[-1.2, -1.0, -0.5, -0.1]])  # delta = ref - logp: -0.2, 1.0, 0.0, 5.9 (k3 = 358: clamped)
    kl = core_algos.kl_penalty(logp, ref, cfg.actor_rollout_ref.actor.kl_loss_type)
    expected = []
    for d in (ref - logp)[0].tolist():
        expected.append(min(max(math.exp(d) - 1.0 - d, -10.0), 10.0))
    assert kl[0].tolist() == pytest.approx(expected, rel=1e-9)
    assert expected[-1] == 10.0


def test_policy_loss_is_asymmetric_ppo_clip_times_tis_then_per_sample_mean(cfg):
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    eps_lo, eps_hi = cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high
    old = t([[-1.0] * 6, [-1.0] * 6, [-1.0] * 6])
    # ratios rho = exp(logp - old): inside, above 1 + eps_high, below 1 - eps_low, between 1.2 and 1.28.
    log_rho = [
        [0.0, 0.4, -0.4, math.log(1.25), 0.1, -0.1],
        [math.log(1.25), 0.3, -0.3, 0.0, math.log(0.9), math.log(1.1)],
        [0.5, -0.5, 0.2, 0.0, 0.0, 0.0],
    ]
    logp = old + t(log_rho)
    adv_rows = [[1.0] * 6, [-1.0] * 6, [0.5] * 6]
    weights = t(
        [[1.0, 2.0, 0.5, 1.0, 1.5, 1.0], [1.0, 0.7, 2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]
    )
    loss_fn = core_algos.get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    loss, metrics = loss_fn(
        old_log_prob=old,
        log_prob=logp,
        advantages=t(adv_rows),
        response_mask=t(MASK).bool(),
        loss_agg_mode=cfg.actor_rollout_ref.actor.loss_agg_mode,
        config=actor,
        rollout_is_weights=weights,
    )
    per_token = []
    for i in range(3):
        row = []
        for j in range(6):
            rho, a = math.exp(log_rho[i][j]), adv_rows[i][j]
            clipped = min(max(rho, 1 - eps_lo), 1 + eps_hi)
            row.append(max(-a * rho, -a * clipped) * float(weights[i, j]))
        per_token.append(row)
    assert float(loss) == pytest.approx(per_sample_mean(per_token, MASK), rel=1e-9)
    # The asymmetric side: rho 1.25 with A > 0 is not clipped (1.25 < 1.28), with A < 0 either.
    assert max(-1.0 * 1.25, -1.0 * min(1.25, 1 + eps_hi)) == -1.25
    clipped_tokens = sum(
        1
        for i in range(3)
        for j in range(6)
        if MASK[i][j]
        and -adv_rows[i][j] * min(max(math.exp(log_rho[i][j]), 1 - eps_lo), 1 + eps_hi)
        > -adv_rows[i][j] * math.exp(log_rho[i][j])
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped_tokens / sum(map(sum, MASK)))


def test_per_sample_mean_ignores_masked_tool_tokens_and_weighs_samples_equally(cfg):
    loss_mat = t([[1.0, 2.0, 100.0, 100.0, 3.0, 4.0], [1.0] * 6, [6.0, 0.0, 3.0, 50.0, 50.0, 50.0]])
    got = core_algos.agg_loss(
        loss_mat=loss_mat, loss_mask=t(MASK), loss_agg_mode=cfg.actor_rollout_ref.actor.loss_agg_mode
    )
    assert float(got) == pytest.approx(
        mean([(1 + 2 + 3 + 4) / 4, 1.0, (6 + 0 + 3) / 3]), rel=1e-8
    )  # verl divides by (tokens + 1e-8)
    # A sample whose response is wholly masked (an all-tool padding row) does not count as a sample.
    with_empty = core_algos.agg_loss(
        loss_mat=torch.cat([loss_mat, t([[9.0] * 6])]),
        loss_mask=torch.cat([t(MASK), t([[0.0] * 6])]),
        loss_agg_mode=cfg.actor_rollout_ref.actor.loss_agg_mode,
    )
    assert float(with_empty) == pytest.approx(float(got), rel=1e-8)  # verl divides by (tokens + 1e-8)
