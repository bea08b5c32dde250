"""sweflow.train.algos reproduces the recipe's GRPO formulas (REFERENCE "Formulas").

Every reference number is computed here in plain Python (math, loops over lists) from the formula, on
hand-made samples; the function under test is never used to produce its own expectation.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sweflow.train.algos import (  # noqa: E402
    KL_CLAMP,
    LossConfig,
    group_advantages,
    grpo_loss,
    k3_kl,
    per_sample_mean,
    ppo_clip_loss,
    tis_weights,
    whiten,
)
from sweflow.train.recipe import Recipe  # noqa: E402

EPS = 1e-6
CLIP_LOW, CLIP_HIGH, CAP, KL_COEF = 0.2, 0.28, 2.0, 0.001
# Loss masks: sample 0 has a tool-output span (positions 2-3) in the middle of its completion; sample 1 is
# fully trained; sample 2 is short (three loss tokens, then padding).
MASK = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


def unbiased_std(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ref_per_sample_mean(rows, mask_rows):
    """Mean over each sample's loss tokens, then over all samples (a sample with none counts 0)."""
    per = []
    for row, mrow in zip(rows, mask_rows, strict=True):
        n = sum(mrow)
        per.append(sum(v for v, m in zip(row, mrow, strict=True) if m) / n if n else 0.0)
    return mean(per)


def ref_token_mean(rows, mask_rows):
    vals = [v for row, mrow in zip(rows, mask_rows, strict=True) for v, m in zip(row, mrow, strict=True) if m]
    return mean(vals)


def ref_clip(ratio, adv):
    return max(-adv * ratio, -adv * min(max(ratio, 1 - CLIP_LOW), 1 + CLIP_HIGH))


def ref_k3(logp, ref):
    d = ref - logp
    return min(max(math.exp(d) - 1 - d, -10.0), 10.0)


def ref_tis(old, rollout):
    return min(max(math.exp(old - rollout), 0.0), CAP)


# ------------------------------------------------------------------------------------- advantages
def test_group_advantages_use_the_unbiased_std_plus_1e_6_per_group():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.25, 0.75]
    groups = ["a", "a", "a", "a", "b", "b"]
    adv = group_advantages(rewards, groups, [True] * 6)
    for g in ("a", "b"):
        vals = [r for r, gg in zip(rewards, groups, strict=True) if gg == g]
        m, s = mean(vals), unbiased_std(vals)
        for i, gg in enumerate(groups):
            if gg == g:
                assert adv[i] == pytest.approx((rewards[i] - m) / (s + EPS), rel=1e-12, abs=1e-12)
    # group a: mean 0.5, unbiased std sqrt(1/3); a population std (0.5) would give exactly +-1
    assert adv[0] == pytest.approx(0.5 / (math.sqrt(1 / 3) + EPS), rel=1e-12)
    # the epsilon is 1e-6 (TRL's own would be 1e-4): group b's |A| = 0.25 / (sqrt(0.125) + 1e-6)
    assert abs(adv[4]) == pytest.approx(0.25 / (math.sqrt(0.125) + 1e-6), rel=1e-12)
    assert abs(adv[4]) != pytest.approx(0.25 / (math.sqrt(0.125) + 1e-4), rel=1e-7)


def test_aborted_samples_get_zero_and_are_left_out_of_their_groups_statistics():
    # group 0: four samples, index 2 aborted (its reward value must not matter); group 1: one valid left
    rewards = [1.0, 0.0, 123.0, 0.5, 1.0, -7.0]
    groups = [0, 0, 0, 0, 1, 1]
    valid = [True, True, False, True, True, False]
    adv = group_advantages(rewards, groups, valid)
    kept = [1.0, 0.0, 0.5]
    m, s = mean(kept), unbiased_std(kept)
    assert adv[0] == pytest.approx((1.0 - m) / (s + EPS), rel=1e-12)
    assert adv[1] == pytest.approx((0.0 - m) / (s + EPS), rel=1e-12)
    assert adv[3] == pytest.approx((0.5 - m) / (s + EPS), rel=1e-12)
    assert adv[2] == 0.0 and adv[5] == 0.0  # aborted: no gradient
    assert adv[4] == 0.0  # a group with one valid sample has no baseline: no gradient
    # changing an aborted sample's reward changes nothing
    assert group_advantages([1.0, 0.0, -5.0, 0.5, 1.0, 3.0], groups, valid) == adv


def test_group_advantages_interleaved_groups_and_zero_variance_groups():
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    groups = ["x", "y", "x", "y", "x", "y"]  # members need not be adjacent
    adv = group_advantages(rewards, groups, [True] * 6)
    xs, ys = [1.0, 1.0, 1.0], [0.0, 0.0, 1.0]
    assert [adv[0], adv[2], adv[4]] == [0.0, 0.0, 0.0]  # all-equal rewards: advantage 0, not nan
    my, sy = mean(ys), unbiased_std(ys)
    assert adv[1] == pytest.approx((0.0 - my) / (sy + EPS), rel=1e-12)
    assert adv[5] == pytest.approx((1.0 - my) / (sy + EPS), rel=1e-12)
    assert all(math.isfinite(a) for a in adv) and mean(xs) == 1.0


def test_group_advantages_without_std_normalisation_are_reward_minus_group_mean():
    rewards = [1.0, 0.0, 0.0, 0.3, 0.9]
    groups = [0, 0, 0, 1, 1]
    valid = [True, True, True, True, True]
    adv = group_advantages(rewards, groups, valid, norm_by_std=False)
    expected = [1.0 - 1 / 3, -1 / 3, -1 / 3, 0.3 - 0.6, 0.9 - 0.6]
    assert adv == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------------------------- whitening
def test_whiten_uses_the_masked_mean_and_bessel_variance_and_zeroes_outside_the_mask():
    values = [[1.0, 1.0, 9.0, 9.0, 1.0, 1.0], [-0.5] * 6, [0.0, 0.0, 0.0, 5.0, 5.0, 5.0]]
    out = whiten(t(values), t(MASK)).tolist()
    loss_vals = [v for row, m in zip(values, MASK, strict=True) for v, k in zip(row, m, strict=True) if k]
    mu = mean(loss_vals)
    var = sum((v - mu) ** 2 for v in loss_vals) / (len(loss_vals) - 1)
    for b in range(3):
        for j in range(6):
            want = (values[b][j] - mu) / math.sqrt(var + 1e-8) if MASK[b][j] else 0.0
            assert out[b][j] == pytest.approx(want, rel=1e-12, abs=1e-12), (b, j)
    # the masked tokens (9.0, 5.0) did not enter the statistics
    assert mu == pytest.approx((1 * 4 + -0.5 * 6 + 0.0 * 3) / 13)


def test_whiten_moves_a_zero_variance_group_off_zero():
    # group 0 (rows 0-1) had all-equal rewards -> advantage 0; group 1 (rows 2-3) had +-1
    adv = [0.0, 0.0, 1.0, -0.5]
    mask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]]
    values = [[a] * 3 for a in adv]
    out = whiten(t(values), t(mask)).tolist()
    toks = [a for a, m in zip(adv, mask, strict=True) for _ in range(sum(m))]
    mu = mean(toks)
    sd = math.sqrt(sum((v - mu) ** 2 for v in toks) / (len(toks) - 1) + 1e-8)
    assert out[0][0] == pytest.approx(-mu / sd, rel=1e-12)
    assert out[0][0] != 0.0  # the known bias of batch whitening
    assert out[2][0] == pytest.approx((1.0 - mu) / sd, rel=1e-12)
    assert out[1][2] == 0.0 and out[3][1] == 0.0


# ------------------------------------------------------------------------------------- TIS, KL, clip
def test_tis_weights_are_exp_old_minus_rollout_clamped_to_0_and_2():
    diffs = [-30.0, -1.0, 0.0, 0.5, math.log(2.0) - 1e-3, math.log(2.0) + 0.1, 1.0, 5.0]
    rollout = [-1.5 + 0.1 * i for i in range(len(diffs))]
    old = [r + d for r, d in zip(rollout, diffs, strict=True)]
    old_t = t([old]).requires_grad_(True)
    w = tis_weights(old_t, t([rollout]), CAP)
    assert w.tolist()[0] == pytest.approx(
        [ref_tis(o, r) for o, r in zip(old, rollout, strict=True)], rel=1e-12
    )
    assert w.tolist()[0][-3:] == [2.0, 2.0, 2.0]  # above the cap: exactly the cap
    assert 1.99 < w.tolist()[0][4] < 2.0  # just under the cap: untouched
    assert not w.requires_grad  # a weight, not a path for the gradient


def test_k3_kl_is_exp_d_minus_1_minus_d_with_d_ref_minus_logp_and_clamped_at_10():
    logp = [-1.0, -2.0, -0.5, -3.0, -0.2]
    ref = [-1.0, -1.5, -1.3, 0.0, -2.2]  # d = 0, 0.5, -0.8, 3.0 (binds: e^3 - 4 = 16.1), -2.0
    kl = k3_kl(t([logp]), t([ref])).tolist()[0]
    assert kl == pytest.approx([ref_k3(a, b) for a, b in zip(logp, ref, strict=True)], rel=1e-12)
    assert math.exp(3.0) - 1 - 3.0 > 10.0 and kl[3] == KL_CLAMP == 10.0
    # the direction matters: d = +0.5 and d = -0.5 give different values
    assert kl[1] == pytest.approx(math.exp(0.5) - 1.5, rel=1e-12)
    swapped = k3_kl(t([ref]), t([logp])).tolist()[0]
    assert swapped[1] == pytest.approx(math.exp(-0.5) - 1 + 0.5, rel=1e-12) and swapped[1] != kl[1]


RATIOS = [0.5, 0.79, 0.81, 1.0, 1.2, 1.27, 1.29, 2.0]


@pytest.mark.parametrize("adv", [1.0, -1.0, 2.5, -0.4])
def test_ppo_clip_has_an_asymmetric_high_side_and_flags_clipped_tokens(adv):
    old = [-1.0 - 0.1 * i for i in range(len(RATIOS))]
    logp = [o + math.log(r) for o, r in zip(old, RATIOS, strict=True)]
    loss, clipped = ppo_clip_loss(t([logp]), t([old]), t([[adv] * len(RATIOS)]), CLIP_LOW, CLIP_HIGH)
    assert loss.tolist()[0] == pytest.approx([ref_clip(r, adv) for r in RATIOS], rel=1e-9, abs=1e-12)
    # clipped: a positive advantage above 1 + 0.28, a negative one below 1 - 0.2 (the pessimistic side)
    want = [1.0 if (adv > 0 and r > 1 + CLIP_HIGH) or (adv < 0 and r < 1 - CLIP_LOW) else 0.0 for r in RATIOS]
    assert clipped.tolist()[0] == want
    if adv > 0:
        assert want == [0, 0, 0, 0, 0, 0, 1, 1]  # 1.27 is inside the high side (a symmetric 0.2 clips it)
        assert loss.tolist()[0][5] == pytest.approx(-adv * 1.27)
    else:
        assert want == [1, 1, 0, 0, 0, 0, 0, 0]
        assert loss.tolist()[0][0] == pytest.approx(-adv * 0.8)  # ratio 0.5 counts as 0.8
        assert loss.tolist()[0][-1] == pytest.approx(-adv * 2.0)  # no upper clip for a negative advantage


# ------------------------------------------------------------------------------------- reduction
def test_per_sample_mean_ignores_masked_tool_tokens_and_weighs_samples_equally():
    values = [[1.0, 1.0, 50.0, 50.0, 1.0, 1.0], [0.0] * 6, [3.0, 3.0, 3.0, 7.0, 7.0, 7.0]]
    got = float(per_sample_mean(t(values), t(MASK)))
    assert got == pytest.approx(ref_per_sample_mean(values, MASK), rel=1e-12)
    assert got == pytest.approx((1.0 + 0.0 + 3.0) / 3, rel=1e-12)
    # a token-level mean would let the 6-token sample weigh twice the 3-token one
    assert got != pytest.approx(ref_token_mean(values, MASK))
    # changing a masked (tool output) token's value does not change the result
    values[0][2] = -1e6
    values[2][4] = 1e6
    assert float(per_sample_mean(t(values), t(MASK))) == pytest.approx(got, rel=1e-12)


def test_per_sample_mean_counts_a_sample_without_loss_tokens_as_zero():
    # the documented choice (an aborted sample's mask is all zero): it adds 0 to the mean over samples
    values = [[2.0, 4.0], [100.0, 100.0]]
    got = float(per_sample_mean(t(values), t([[1, 1], [0, 0]])))
    assert got == pytest.approx(ref_per_sample_mean(values, [[1, 1], [0, 0]])) == pytest.approx(1.5)


# ------------------------------------------------------------------------------------- the whole loss
def _batch():
    """Hand-made (B=3, T=6) logps chosen so ratios fall on both sides of both clip edges, TIS weights above
    and below the cap, and one KL term hits its clamp."""
    ratios = [[1.5, 0.7, 1.0, 1.0, 1.1, 1.25], [0.6, 0.95, 1.35, 1.0, 0.85, 1.3], [1.0, 0.75, 1.1, 1, 1, 1]]
    tis = [[1.0, 3.0, 9.0, 1.0, 0.5, 2.5], [1.2, 0.3, 1.0, 4.0, 1.9, 1.0], [2.1, 1.0, 0.9, 1, 1, 1]]
    dref = [[0.1, -0.3, 0.0, 4.0, 0.2, 0.0], [0.05, 0.0, -0.1, 0.3, 3.5, 0.0], [0.2, -0.2, 0.0, 0, 0, 0]]
    logp = [[-0.5 - 0.1 * j - 0.3 * b for j in range(6)] for b in range(3)]
    old = [
        [lp - math.log(r) for lp, r in zip(lr, rr, strict=True)] for lr, rr in zip(logp, ratios, strict=True)
    ]
    rollout = [
        [o - math.log(w) for o, w in zip(orow, wr, strict=True)] for orow, wr in zip(old, tis, strict=True)
    ]
    ref = [[lp + d for lp, d in zip(lr, dr, strict=True)] for lr, dr in zip(logp, dref, strict=True)]
    adv = [1.0, -0.5, 2.0]
    return logp, old, rollout, ref, adv


def _reference_loss(logp, old, rollout, ref, adv, mask, *, tis=True):
    pg_rows, kl_rows, w_rows, raw_rows, clip_rows = [], [], [], [], []
    for b in range(len(logp)):
        pg, kl, ws, raws, cl = [], [], [], [], []
        for j in range(len(logp[b])):
            r = math.exp(logp[b][j] - old[b][j])
            w = ref_tis(old[b][j], rollout[b][j]) if tis else 1.0
            pg.append(ref_clip(r, adv[b]) * w)
            kl.append(ref_k3(logp[b][j], ref[b][j]))
            ws.append(w)
            raws.append(1.0 if math.exp(old[b][j] - rollout[b][j]) > CAP else 0.0)
            cl.append(1.0 if (adv[b] > 0 and r > 1 + CLIP_HIGH) or (adv[b] < 0 and r < 1 - CLIP_LOW) else 0.0)
        pg_rows.append(pg)
        kl_rows.append(kl)
        w_rows.append(ws)
        raw_rows.append(raws)
        clip_rows.append(cl)
    policy = ref_per_sample_mean(pg_rows, mask)
    kl = ref_per_sample_mean(kl_rows, mask)
    stats = {
        "policy_loss": policy,
        "kl": kl,
        "clip_fraction": ref_token_mean(clip_rows, mask),
        "tis_weight_mean": ref_token_mean(w_rows, mask),
        "tis_clipped_share": ref_token_mean(raw_rows, mask),
    }
    return policy + KL_COEF * kl, stats


def test_grpo_loss_is_tis_weighted_clipped_policy_loss_plus_0_001_k3_kl():
    logp, old, rollout, ref, adv = _batch()
    cfg = LossConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.tis, cfg.tis_cap) == (0.2, 0.28, 0.001, True, 2.0)
    loss, stats = grpo_loss(t(logp), t(old), t(adv), t(MASK), cfg, rollout_logp=t(rollout), ref_logp=t(ref))
    want, want_stats = _reference_loss(logp, old, rollout, ref, adv, MASK)
    assert float(loss) == pytest.approx(want, rel=1e-10)
    for k, v in want_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-10, abs=1e-12), k
    # the hand-made batch exercises what it claims to
    assert 0 < want_stats["clip_fraction"] < 1 and 0 < want_stats["tis_clipped_share"] < 1
    assert MASK[1][4] and ref_k3(logp[1][4], ref[1][4]) == 10.0  # a loss token whose KL clamp binds
    # (B, T) advantages broadcast the same way as (B,)
    adv_bt = t([[a] * 6 for a in adv])
    loss2, _ = grpo_loss(t(logp), t(old), adv_bt, t(MASK), cfg, rollout_logp=t(rollout), ref_logp=t(ref))
    assert float(loss2) == pytest.approx(want, rel=1e-12)


def test_grpo_loss_without_tis_or_reference_and_with_the_entropy_stat():
    logp, old, rollout, ref, adv = _batch()
    cfg = LossConfig(tis=False)
    loss, stats = grpo_loss(t(logp), t(old), t(adv), t(MASK), cfg, rollout_logp=t(rollout), ref_logp=t(ref))
    want, _ = _reference_loss(logp, old, rollout, ref, adv, MASK, tis=False)
    assert float(loss) == pytest.approx(want, rel=1e-10)
    assert "tis_weight_mean" not in stats
    ent = [[0.1 * (j + 1) for j in range(6)] for _ in range(3)]
    loss_p, stats_p = grpo_loss(t(logp), t(old), t(adv), t(MASK), LossConfig(), entropy=t(ent))
    assert "kl" not in stats_p  # no reference: policy loss alone
    assert stats_p["entropy"] == pytest.approx(ref_per_sample_mean(ent, MASK), rel=1e-12)
    assert float(loss_p) == pytest.approx(
        stats_p["policy_loss"], rel=1e-12
    )  # entropy_coef 0: not in the loss


def test_loss_config_from_the_production_recipe():
    cfg = LossConfig.from_recipe(Recipe())
    assert cfg == LossConfig(
        clip_low=0.2, clip_high=0.28, kl_coef=0.001, tis=True, tis_cap=2.0, entropy_coef=0.0
    )
    assert LossConfig.from_recipe(Recipe(tis_level="off")).tis is False


def test_gradient_of_the_loss_wrt_one_tokens_logp_matches_the_hand_derived_value():
    logp, old, rollout, ref, adv = _batch()
    lp = t(logp).requires_grad_(True)
    loss, _ = grpo_loss(lp, t(old), t(adv), t(MASK), LossConfig(), rollout_logp=t(rollout), ref_logp=t(ref))
    loss.backward()
    grad = lp.grad.tolist()
    n_samples = len(logp)

    def hand(b, j):
        """d loss / d logp[b][j] = (1/B)(1/n_b) [w * d clip / d logp + coef * d k3 / d logp]."""
        if not MASK[b][j]:
            return 0.0
        n_b = sum(MASK[b])
        r = math.exp(logp[b][j] - old[b][j])
        a = adv[b]
        clipped = (a > 0 and r > 1 + CLIP_HIGH) or (a < 0 and r < 1 - CLIP_LOW)
        d_pg = 0.0 if clipped else -a * r  # d(-A r)/d logp = -A r; the clipped branch is constant
        w = ref_tis(old[b][j], rollout[b][j])
        d = ref[b][j] - logp[b][j]
        k3 = math.exp(d) - 1 - d
        d_kl = 0.0 if k3 > 10.0 else 1.0 - math.exp(d)  # d(e^d - 1 - d)/d logp = -(e^d - 1); clamp: 0
        return (w * d_pg + KL_COEF * d_kl) / (n_samples * n_b)

    # the tokens that matter: unclipped (0,0: ratio 1.5 > 1.28 is clipped; 0,4 is not), clipped with a
    # negative advantage (1,0), a masked tool token (0,2), a KL clamp that binds (0,3 is masked; 1,4 binds)
    for b, j in [(0, 4), (0, 0), (0, 5), (1, 0), (1, 2), (1, 4), (2, 1), (0, 2), (2, 4)]:
        assert grad[b][j] == pytest.approx(hand(b, j), rel=1e-9, abs=1e-15), (b, j)
    assert grad[0][4] == pytest.approx(-(0.5 * 1.0 * 1.1) / (3 * 4) + KL_COEF * (1 - math.exp(0.2)) / (3 * 4))
    assert grad[0][0] == pytest.approx(KL_COEF * (1 - math.exp(0.1)) / (3 * 4))  # clipped: only the KL term
    assert grad[1][4] == pytest.approx(1.9 * 0.5 * 0.85 / (3 * 6))  # KL clamped: only the policy term
    assert grad[0][2] == 0.0 and grad[2][4] == 0.0
