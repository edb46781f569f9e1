"""Tests for slime.algo.rewards (docs/algorithms.md#reward-post-processing, rloo)."""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.rewards import group_normalize, rloo_advantages

D = torch.float64
EPS = 1e-6


def t(xs):
    return torch.tensor(xs, dtype=D)


def test_reference_row_1000():
    # mean 0.25; centred [0.75, -0.25 x3]; s^2 = (0.5625 + 3*0.0625)/3 = 0.25 -> s = 0.5
    out = group_normalize(t([1, 0, 0, 0]), 4)
    expected = t([0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3)
    assert_close(out, expected, rtol=0, atol=1e-12)
    assert_close(out, t([1.499997, -0.499999, -0.499999, -0.499999]), rtol=0, atol=1e-6)


def test_reference_row_1100():
    # centred ±0.5; s^2 = 4*0.25/3 = 1/3
    s = math.sqrt(1 / 3)
    out = group_normalize(t([1, 1, 0, 0]), 4)
    assert_close(out, t([0.5 / (s + EPS)] * 2 + [-0.5 / (s + EPS)] * 2), rtol=0, atol=1e-12)
    assert_close(out, t([0.8660239, 0.8660239, -0.8660239, -0.8660239]), rtol=0, atol=1e-7)


def test_reference_row_dapo_pm1():
    # mean -0.5; centred [1.5, -0.5 x3]; s^2 = (2.25 + 3*0.25)/3 = 1
    out = group_normalize(t([1, -1, -1, -1]), 4)
    assert_close(out, t([1.5 / (1 + EPS)] + [-0.5 / (1 + EPS)] * 3), rtol=0, atol=1e-12)
    assert_close(out, t([1.4999985, -0.4999995, -0.4999995, -0.4999995]), rtol=0, atol=1e-7)


def test_reference_row_half():
    # mean 0.375; centred [0.125, 0.625, -0.375, -0.375]
    # s^2 = (0.015625 + 0.390625 + 2*0.140625)/3 = 0.6875/3
    s = math.sqrt(0.6875 / 3)
    out = group_normalize(t([0.5, 1, 0, 0]), 4)
    expected = t([0.125 / (s + EPS), 0.625 / (s + EPS), -0.375 / (s + EPS), -0.375 / (s + EPS)])
    assert_close(out, expected, rtol=0, atol=1e-12)
    assert_close(out, t([0.2611159, 1.3055797, -0.7833478, -0.7833478]), rtol=0, atol=1e-7)


def test_identical_rewards_give_zero_not_nan():
    out = group_normalize(t([1, 1, 1, 1, 0, 0, 0, 0]), 4)
    assert torch.isfinite(out).all()
    assert_close(out, torch.zeros(8, dtype=D), rtol=0, atol=0)


def test_groups_are_independent_rows():
    # two groups: [1,0,0,0] and [1,1,0,0]; each normalised with its own stats
    out = group_normalize(t([1, 0, 0, 0, 1, 1, 0, 0]), 4)
    s2 = math.sqrt(1 / 3)
    expected = t([0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3 + [0.5 / (s2 + EPS)] * 2 + [-0.5 / (s2 + EPS)] * 2)
    assert_close(out, expected, rtol=0, atol=1e-12)


def test_mean_only_dr_grpo():
    out = group_normalize(t([1, 0, 0, 0]), 4, divide_std=False)
    assert_close(out, t([0.75, -0.25, -0.25, -0.25]), rtol=0, atol=1e-15)


def test_no_normalisation_is_identity():
    x = t([0.3, -2.0, 5.0, 1.0])
    assert_close(group_normalize(x, 2, subtract_mean=False, divide_std=False), x, rtol=0, atol=0)


def test_std_only():
    # group [2, 4]: s = sqrt(((2-3)^2 + (4-3)^2)/1) = sqrt(2); no centring
    out = group_normalize(t([2.0, 4.0]), 2, subtract_mean=False)
    assert_close(out, t([2 / (math.sqrt(2) + EPS), 4 / (math.sqrt(2) + EPS)]), rtol=0, atol=1e-12)


def test_single_sample_per_prompt():
    # n == 1: std forced off; centring against itself gives 0
    x = t([0.7, -3.0, 2.0])
    assert_close(group_normalize(x, 1), torch.zeros(3, dtype=D), rtol=0, atol=0)
    # without centring (std forced off) the rewards pass through unchanged
    assert_close(group_normalize(x, 1, subtract_mean=False), x, rtol=0, atol=0)


def test_indivisible_batch_raises_naming_both_numbers():
    with pytest.raises(ValueError, match=r"7.*4|4.*7"):
        group_normalize(torch.zeros(7, dtype=D), 4)


def test_rloo_reference():
    # n/(n-1) * (r - mean) = 4/3 * [0.75, -0.25, ...] = [1, -1/3, -1/3, -1/3]
    out = rloo_advantages(t([1, 0, 0, 0]), 4)
    assert_close(out, t([1.0, -1 / 3, -1 / 3, -1 / 3]), rtol=0, atol=1e-15)


def test_rloo_matches_leave_one_out_definition():
    x = t([0.2, 1.5, -0.7, 3.0, 1.0, 2.0])
    out = rloo_advantages(x, 3)
    expected = []
    for g in range(2):
        row = x[3 * g : 3 * g + 3].tolist()
        for i in range(3):
            others = [row[j] for j in range(3) if j != i]
            expected.append(row[i] - sum(others) / 2)
    assert_close(out, t(expected), rtol=0, atol=1e-14)


def test_rloo_rejects_n_below_two_and_bad_batch():
    with pytest.raises(ValueError):
        rloo_advantages(t([1.0, 2.0]), 1)
    with pytest.raises(ValueError):
        rloo_advantages(t([1.0, 2.0, 3.0]), 2)
