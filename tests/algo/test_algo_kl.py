"""Tests for slime.algo.kl (docs/algorithms.md#kl-estimators: its examples)."""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.kl import KL_TYPES, approx_kl

D = torch.float64
X = [0.1, -0.5, -15.0]


def _kl(kind, **kw):
    lp = torch.tensor(X, dtype=D)
    ref = torch.zeros(3, dtype=D)
    return approx_kl(lp + 1.0, ref + 1.0, kind, **kw)  # x = lp - ref regardless of offset


def test_kl_types_exported():
    assert KL_TYPES == ("k1", "k2", "k3", "low_var_kl")


def test_k1():
    assert_close(_kl("k1"), torch.tensor(X, dtype=D), rtol=0, atol=1e-14)


def test_k2():
    assert_close(_kl("k2"), torch.tensor([0.005, 0.125, 112.5], dtype=D), rtol=1e-12, atol=1e-14)


def test_k3():
    expected = torch.tensor([math.exp(-x) - 1 + x for x in X], dtype=D)
    assert_close(_kl("k3"), expected, rtol=1e-12, atol=1e-14)
    assert_close(_kl("k3")[:2], torch.tensor([0.0048374, 0.1487213], dtype=D), rtol=0, atol=1e-7)
    assert 3.26e6 < _kl("k3")[2].item() < 3.27e6  # exp(15) - 16 = 3269001.37


def test_low_var_kl_clamps():
    out = _kl("low_var_kl")
    expected = torch.tensor([math.exp(-0.1) - 1 + 0.1, math.exp(0.5) - 1.5, 10.0], dtype=D)
    assert_close(out, expected, rtol=1e-12, atol=1e-14)


def test_importance_ratio_multiplies_before_clamp():
    ratio = torch.tensor([2.0, 0.5, 1e-6], dtype=D)
    k3 = [math.exp(-x) - 1 + x for x in X]
    # low_var_kl: multiply first, then clamp: 3269001.37 * 1e-6 = 3.269 is NOT clamped
    out = _kl("low_var_kl", importance_ratio=ratio)
    assert_close(out, torch.tensor([2 * k3[0], 0.5 * k3[1], 1e-6 * k3[2]], dtype=D), rtol=1e-12, atol=1e-14)
    # k1 is just multiplied
    out1 = _kl("k1", importance_ratio=ratio)
    assert_close(out1, torch.tensor([0.2, -0.25, -15e-6], dtype=D), rtol=1e-12, atol=1e-15)
    # a large ratio still ends up clamped to 10
    big = _kl("low_var_kl", importance_ratio=torch.tensor([1e4, 1.0, 1.0], dtype=D))
    assert big[0].item() == 10.0


def test_unknown_type_lists_valid_names():
    with pytest.raises(ValueError, match="k1.*k2.*k3.*low_var_kl"):
        approx_kl(torch.zeros(1, dtype=D), torch.zeros(1, dtype=D), "k4")
