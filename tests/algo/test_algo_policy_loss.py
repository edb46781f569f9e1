"""Tests for slime.algo.policy_loss (PPO clip, GSPO, CISPO: docs/algorithms.md#policy-loss)."""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.policy_loss import cispo_loss, gspo_log_ratio, ppo_clip_loss, sft_loss

D = torch.float64


def t(xs, **kw):
    return torch.tensor(xs, dtype=D, **kw)


# ---------------------------------------------------------------- PPO clip (its examples)
RATIOS = [1.5, 0.5, 0.5, 5.0]
ADVS = [1.0, 1.0, -1.0, -1.0]


def _ppo(**kw):
    lp = t([math.log(r) for r in RATIOS])
    return ppo_clip_loss(lp, torch.zeros(4, dtype=D), t(ADVS), eps_clip=0.2, **kw)


def test_ppo_reference_table():
    out = _ppo(eps_clip_high=0.28)
    # L = max(-rho*A, -clip(rho, 0.8, 1.28)*A)
    expected = [max(-1.5, -1.28), max(-0.5, -0.8), max(0.5, 0.8), max(5.0, 1.28)]
    assert_close(out["loss"], t(expected), rtol=0, atol=1e-12)
    assert_close(out["loss"], t([-1.28, -0.5, 0.8, 5.0]), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], t([1.0, 0.0, 1.0, 0.0]), rtol=0, atol=0)
    assert_close(out["ratio"], t(RATIOS), rtol=0, atol=1e-12)
    assert_close(out["ppo_kl"], t([-math.log(r) for r in RATIOS]), rtol=0, atol=1e-15)


def test_ppo_symmetric_default_high():
    out = _ppo()  # eps_clip_high defaults to eps_clip: clip to [0.8, 1.2]
    assert_close(out["loss"][0], t(-1.2), rtol=0, atol=1e-12)


def test_ppo_dual_clip_only_negative_advantages():
    out = _ppo(eps_clip_high=0.28, eps_clip_c=3.0)
    # A = -1, rho = 5: min(-3*(-1), 5) = 3; A = -1, rho = 0.5: min(3, 0.8) = 0.8
    # A = +1 tokens unchanged although -c*A = -3 would be smaller
    assert_close(out["loss"], t([-1.28, -0.5, 0.8, 3.0]), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], t([1.0, 0.0, 1.0, 0.0]), rtol=0, atol=0)


def test_ppo_dual_clip_must_exceed_one():
    with pytest.raises(ValueError):
        _ppo(eps_clip_c=1.0)


def test_ppo_gradient_zero_on_clipped_tokens():
    lp = t([math.log(r) for r in RATIOS], requires_grad=True)
    out = ppo_clip_loss(lp, torch.zeros(4, dtype=D), t(ADVS), eps_clip=0.2, eps_clip_high=0.28)
    out["loss"].sum().backward()
    # unclipped: dL/dl = -rho*A; clipped: 0
    assert_close(lp.grad, t([0.0, -0.5 * 1.0, 0.0, -5.0 * -1.0]), rtol=0, atol=1e-12)


def test_ppo_identical_policies_ratio_one():
    lp = t([-1.0, -2.0])
    out = ppo_clip_loss(lp, lp.clone(), t([0.5, -2.0]), eps_clip=0.2)
    assert_close(out["ratio"], t([1.0, 1.0]), rtol=0, atol=0)
    assert_close(out["ppo_kl"], t([0.0, 0.0]), rtol=0, atol=0)
    assert_close(out["loss"], t([-0.5, 2.0]), rtol=0, atol=0)


# ---------------------------------------------------------------- GSPO
def test_gspo_reference_example():
    # diffs [0.1, -0.3] -> s = -0.2/2 = -0.1 -> rho = exp(-0.1) on both tokens
    s = gspo_log_ratio(t([0.1, -0.3]), t([0.0, 0.0]), t([1, 1]), [2])
    assert_close(s, t([-0.1, -0.1]), rtol=0, atol=1e-15)
    # log_ratio overrides l - l_old (the first two arguments are then unused)
    out = ppo_clip_loss(t([5.0, 5.0]), t([0.0, 0.0]), t([1.0, 1.0]), eps_clip=4e-4, log_ratio=s)
    assert_close(out["ratio"], t([0.904837] * 2), rtol=0, atol=1e-6)
    assert_close(out["ppo_kl"], t([0.1, 0.1]), rtol=0, atol=1e-15)


def test_gspo_mask_and_fully_masked_sample():
    # sample 1: mask [1,0,1], diffs [0.2, 5.0, 0.4] -> s = (0.2 + 0.4)/2 = 0.3
    # sample 2: fully masked -> 0 / max(0, 1) = 0
    lp = t([0.1, -0.3, 0.2, 5.0, 0.4, 9.0, -9.0])
    s = gspo_log_ratio(lp, torch.zeros(7, dtype=D), t([1, 1, 1, 0, 1, 0, 0]), [2, 3, 2])
    assert_close(s, t([-0.1, -0.1, 0.3, 0.3, 0.3, 0.0, 0.0]), rtol=0, atol=1e-15)


def test_gspo_gradient_reaches_every_masked_token_through_s():
    # sample 1: diffs [0.1, -0.3], A = +1, rho = e^-0.1 in [1-eps, 1+eps] (eps 0.2): unclipped.
    #   sum of its 2 token losses = -2 e^s A; ds/dl_t = 1/2 -> dL/dl_t = -e^-0.1 on both tokens
    # sample 2: mask [1,0,1], diffs [0.2, 5.0, 0.4], s = 0.3, A = -1: -rho*A = e^0.3 = 1.35 > 1.2
    #   so unclipped; sum of its 3 token losses = 3 e^s; dL/dl_t = 3 e^0.3 * m_t / 2
    lp = t([0.1, -0.3, 0.2, 5.0, 0.4], requires_grad=True)
    old = torch.zeros(5, dtype=D)
    lengths = [2, 3]
    s = gspo_log_ratio(lp, old, t([1, 1, 1, 0, 1]), lengths)
    out = ppo_clip_loss(lp, old, t([1.0, 1.0, -1.0, -1.0, -1.0]), eps_clip=0.2, log_ratio=s)
    assert_close(out["clipfrac"], torch.zeros(5, dtype=D), rtol=0, atol=0)
    out["loss"].sum().backward()
    g2 = 3 * math.exp(0.3) / 2
    assert_close(lp.grad, t([-math.exp(-0.1), -math.exp(-0.1), g2, 0.0, g2]), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- CISPO
def test_cispo_values_and_gradient_through_clipped_tokens():
    # ratio = [0.25/0.5, 0.5/0.5, 0.9/0.5] = [0.5, 1.0, 1.8] -> clip to [0.8, 1.28]: [0.8, 1.0, 1.28]
    old = t([math.log(0.5)] * 3, requires_grad=True)
    lp = t([math.log(0.25), math.log(0.5), math.log(0.9)], requires_grad=True)
    adv = t([1.0, -1.0, 2.0])
    out = cispo_loss(lp, old, adv, eps_clip=0.2, eps_clip_high=0.28)
    clipped = [0.8, 1.0, 1.28]
    expected = [
        -clipped[0] * 1.0 * math.log(0.25),
        -clipped[1] * -1.0 * math.log(0.5),
        -clipped[2] * 2.0 * math.log(0.9),
    ]
    assert_close(out["loss"], t(expected), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], t([1.0, 0.0, 1.0]), rtol=0, atol=0)
    assert_close(out["ratio"], t([0.5, 1.0, 1.8]), rtol=0, atol=1e-12)
    assert_close(out["ppo_kl"], t([math.log(2.0), 0.0, -math.log(1.8)]), rtol=0, atol=1e-12)
    out["loss"].sum().backward()
    # dL/dl_t = -stopgrad(clip) * A, nonzero on the clipped tokens too; nothing reaches old
    assert_close(lp.grad, t([-0.8 * 1.0, -1.0 * -1.0, -1.28 * 2.0]), rtol=0, atol=1e-12)
    assert old.grad is None or torch.all(old.grad == 0)


# ---------------------------------------------------------------- SFT
def test_sft_loss_negates_and_keeps_gradient():
    lp = t([-0.5, -2.0], requires_grad=True)
    loss = sft_loss(lp)
    assert_close(loss, t([0.5, 2.0]), rtol=0, atol=0)
    loss.sum().backward()
    assert_close(lp.grad, t([-1.0, -1.0]), rtol=0, atol=0)
