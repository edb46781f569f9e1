"""Tests for slime.algo.value_loss (docs/algorithms.md#value-loss)."""

import pytest
import torch
from torch.testing import assert_close

from slime.algo.value_loss import clipped_value_loss

D = torch.float64


def t(xs, **kw):
    return torch.tensor(xs, dtype=D, **kw)


def test_value_loss_cases_and_gradient():
    # token 0 (reference): V_old 0.5, V 0.9, R 1 -> V_clip 0.7 -> max(0.3^2, 0.1^2) = 0.09, clipped
    # token 1: V 0.6 within 0.2 of V_old -> V_clip = V -> 0.4^2 = 0.16, not clipped
    # token 2: V 0.1 -> V_clip 0.3 -> max(0.7^2, 0.9^2) = 0.81; |V - V_old| = 0.4 > 0.2 -> clipfrac 1
    v = t([0.9, 0.6, 0.1], requires_grad=True)
    out = clipped_value_loss(v, t([0.5, 0.5, 0.5]), t([1.0, 1.0, 1.0]), value_clip=0.2)
    assert_close(out["loss"], t([0.3**2, 0.4**2, 0.9**2]), rtol=0, atol=1e-12)
    assert_close(out["loss"][0], t(0.09), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], t([1.0, 0.0, 1.0]), rtol=0, atol=0)
    out["loss"].sum().backward()
    # token 0 takes the clipped (constant in V) branch -> 0; others 2 (V - R)
    assert_close(v.grad, t([0.0, 2 * (0.6 - 1.0), 2 * (0.1 - 1.0)]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("vc", [0.1, 0.5])
def test_value_loss_no_half_factor(vc):
    out = clipped_value_loss(t([2.0]), t([2.0]), t([0.0]), value_clip=vc)
    assert_close(out["loss"], t([4.0]), rtol=0, atol=0)
    assert_close(out["clipfrac"], t([0.0]), rtol=0, atol=0)
