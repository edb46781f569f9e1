"""Tests for slime.algo.advantages (docs/algorithms.md#advantage-estimators, #advantage-whitening)."""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.advantages import (
    broadcast_to_tokens,
    gae,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    whiten,
)

D = torch.float64


def t(xs):
    return torch.tensor(xs, dtype=D)


# ---------------------------------------------------------------- broadcast
def test_broadcast_to_tokens():
    out = broadcast_to_tokens(t([1.5, -2.0, 7.0]), [2, 0, 3])
    assert_close(out, t([1.5, 1.5, 7.0, 7.0, 7.0]), rtol=0, atol=0)


def test_broadcast_length_mismatch_raises():
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([1.0, 2.0]), [3])


# ---------------------------------------------------------------- reinforce++
def test_reinforce_pp_reference_example():
    # rho = [-0.5*0.1, -0.5*0, -0.5*0.2 + 1] = [-0.05, 0, 0.9]; G = reverse cumsum
    out = reinforce_plus_plus_returns(t([1.0]), t([0.1, 0.0, 0.2]), t([1, 1, 1]), [3], kl_coef=0.5, gamma=1.0)
    assert_close(out, t([-0.05 + 0 + 0.9, 0 + 0.9, 0.9]), rtol=0, atol=1e-15)
    assert_close(out, t([0.85, 0.9, 0.9]), rtol=0, atol=1e-12)


def test_reinforce_pp_reward_at_last_masked_token_and_discount():
    # sample 0: mask [1,1,0] -> kl of masked token dropped, r at index 1:
    #   rho = [-0.05, 0 + 1, 0]; gamma 0.5: G2 = 0, G1 = 1, G0 = -0.05 + 0.5*1
    # sample 1: mask [0,1], kl [0.4, 0.2], r = -2: rho = [0, -0.5*0.2 - 2] = [0, -2.1]
    #   G1 = -2.1, G0 = 0 + 0.5*(-2.1)
    out = reinforce_plus_plus_returns(
        t([1.0, -2.0]),
        t([0.1, 0.0, 0.2, 0.4, 0.2]),
        t([1, 1, 0, 0, 1]),
        [3, 2],
        kl_coef=0.5,
        gamma=0.5,
    )
    assert_close(out, t([-0.05 + 0.5 * 1.0, 1.0, 0.0, 0.5 * -2.1, -2.1]), rtol=0, atol=1e-15)


def test_reinforce_pp_fully_masked_sample_raises():
    with pytest.raises(ValueError, match=r"\[1\]"):
        reinforce_plus_plus_returns(t([1.0, 1.0]), t([0.0] * 4), t([1, 1, 0, 0]), [2, 2], kl_coef=0.0, gamma=1.0)


def test_reinforce_pp_baseline():
    # A_t = r~ - kl_coef * kl_t
    out = reinforce_plus_plus_baseline_advantages(t([0.5, -0.5]), t([0.1, 0.2, 0.3]), [1, 2], kl_coef=0.5)
    assert_close(out, t([0.5 - 0.5 * 0.1, -0.5 - 0.5 * 0.2, -0.5 - 0.5 * 0.3]), rtol=0, atol=1e-15)


# ---------------------------------------------------------------- GAE
def test_gae_reference_example():
    # delta = [0 + 0.4 - 0.2, 0 + 0.6 - 0.4, 1 + 0 - 0.6] = [0.2, 0.2, 0.4]
    # A2 = 0.4; A1 = 0.2 + 0.9*0.4 = 0.56; A0 = 0.2 + 0.9*0.56 = 0.704
    adv, ret = gae(t([0.2, 0.4, 0.6]), t([1.0]), t([0.0, 0.0, 0.0]), [3], kl_coef=0.0, gamma=1.0, lambd=0.9)
    assert_close(adv, t([0.704, 0.56, 0.4]), rtol=0, atol=1e-12)
    assert_close(ret, t([0.904, 0.96, 1.0]), rtol=0, atol=1e-12)


def test_gae_two_samples_with_kl_and_discount():
    # sample 0 as in the reference (kl 0) ; sample 1: V=[0.5,0.1], r=-1, kl=[0.2,0.4],
    # kl_coef 0.1, gamma 0.9, lambda 0.8 (gamma*lambda = 0.72)
    #   rho = [-0.02, -0.04 - 1]; delta1 = -1.04 + 0 - 0.1 = -1.14
    #   delta0 = -0.02 + 0.9*0.1 - 0.5 = -0.43; A1 = -1.14; A0 = -0.43 + 0.72*(-1.14)
    # sample 0 with gamma 0.9, lambda 0.8:
    #   delta = [0.9*0.4 - 0.2, 0.9*0.6 - 0.4, 1 - 0.6] = [0.16, 0.14, 0.4]
    #   A2 = 0.4; A1 = 0.14 + 0.72*0.4; A0 = 0.16 + 0.72*A1
    a1_0 = 0.14 + 0.72 * 0.4
    a0_0 = 0.16 + 0.72 * a1_0
    a0_1 = -0.43 + 0.72 * -1.14
    values = t([0.2, 0.4, 0.6, 0.5, 0.1])
    adv, ret = gae(values, t([1.0, -1.0]), t([0.0, 0.0, 0.0, 0.2, 0.4]), [3, 2], kl_coef=0.1, gamma=0.9, lambd=0.8)
    expected = t([a0_0, a1_0, 0.4, a0_1, -1.14])
    assert_close(adv, expected, rtol=0, atol=1e-14)
    assert_close(ret, expected + values, rtol=0, atol=1e-14)


def test_gae_empty_response_raises():
    with pytest.raises(ValueError):
        gae(t([0.1]), t([1.0, 1.0]), t([0.0]), [1, 0], kl_coef=0.0, gamma=1.0, lambd=1.0)


# ---------------------------------------------------------------- whitening
def test_whiten_reference_example():
    # mu = 0.25; E[A^2] = (2*0.5625 + 2*0.0625)/4 = 0.3125; var = (0.3125 - 0.0625) * 4/3 = 1/3
    out = whiten(t([0.75, 0.75, -0.25, -0.25]), t([1, 1, 1, 1]))
    s = math.sqrt(1 / 3 + 1e-8)
    assert_close(out, t([0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]), rtol=0, atol=1e-14)
    assert_close(out, t([0.8660254] * 2 + [-0.8660254] * 2), rtol=0, atol=1e-7)


def test_whiten_ignores_masked_tokens_in_stats_but_transforms_them():
    out = whiten(t([0.75, 5.0, 0.75, -0.25, -0.25]), t([1, 0, 1, 1, 1]))
    s = math.sqrt(1 / 3 + 1e-8)
    assert_close(out, t([0.5 / s, (5.0 - 0.25) / s, 0.5 / s, -0.5 / s, -0.5 / s]), rtol=0, atol=1e-14)


def test_whiten_all_reduce_pools_ranks():
    # rank a holds [0.75, 0.75], rank b holds [-0.25, -0.25]; the fake all-reduce adds
    # the other rank's [sum mA, sum mA^2, N]
    calls = []

    def add_other(stats_other):
        def all_reduce(stats):
            calls.append(stats.clone())
            return stats + stats_other

        return all_reduce

    a = whiten(t([0.75, 0.75]), t([1, 1]), all_reduce=add_other(t([-0.5, 0.125, 2.0])))
    b = whiten(t([-0.25, -0.25]), t([1, 1]), all_reduce=add_other(t([1.5, 1.125, 2.0])))
    s = math.sqrt(1 / 3 + 1e-8)
    assert_close(torch.cat([a, b]), t([0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]), rtol=0, atol=1e-14)
    # the local stats handed to the all-reduce are [sum mA, sum mA^2, N]
    assert_close(calls[0], t([1.5, 1.125, 2.0]), rtol=0, atol=1e-15)


def test_whiten_single_token_no_bessel_and_constant_no_nan():
    # N = 1: var = 0 (no Bessel factor) -> (3 - 3)/sqrt(1e-8) = 0
    assert_close(whiten(t([3.0]), t([1.0])), t([0.0]), rtol=0, atol=0)
    out = whiten(t([2.0, 2.0, 2.0]), t([1, 1, 1]))
    assert torch.isfinite(out).all()
    assert_close(out, torch.zeros(3, dtype=D), rtol=0, atol=1e-10)


def test_whiten_no_tokens_raises():
    with pytest.raises(ValueError):
        whiten(t([1.0, 2.0]), t([0.0, 0.0]))
