"""Tests for slime.algo.reduction (docs/algorithms.md#loss-reduction): values, edge cases, micro-batch invariance."""

import pytest
import torch
from torch.testing import assert_close

from slime.algo.advantages import broadcast_to_tokens
from slime.algo.kl import approx_kl
from slime.algo.policy_loss import ppo_clip_loss
from slime.algo.reduction import reduce, sample_mask_sums, token_weights

D = torch.float64


def t(xs):
    return torch.tensor(xs, dtype=D)


# Reference example: sample A has masked losses [1, 3], sample B [1, 1, 1, 1].
X_AB = t([1.0, 3.0, 1.0, 1.0, 1.0, 1.0])
M_AB = t([1, 1, 1, 1, 1, 1])
L_AB = [2, 4]


def test_reference_per_sample():
    w = token_weights(M_AB, L_AB, mode="per_sample", num_trajectories=2)
    assert_close(w, t([1 / (2 * 2)] * 2 + [1 / (4 * 2)] * 4), rtol=0, atol=1e-15)
    assert_close(reduce(X_AB, w), t((4 / 2 + 4 / 4) / 2), rtol=0, atol=1e-15)  # 1.5
    # micro-batches {A} and {B}, normalisers fixed at step level
    a = reduce(X_AB[:2], token_weights(M_AB[:2], [2], mode="per_sample", num_trajectories=2))
    b = reduce(X_AB[2:], token_weights(M_AB[2:], [4], mode="per_sample", num_trajectories=2))
    assert_close(a + b, t(1.5), rtol=0, atol=1e-15)


def test_reference_per_token():
    w = token_weights(M_AB, L_AB, mode="per_token", num_trajectories=2, total_masked_tokens=6.0)
    assert_close(reduce(X_AB, w), t(8 / 6), rtol=0, atol=1e-15)
    a = reduce(X_AB[:2], token_weights(M_AB[:2], [2], mode="per_token", num_trajectories=2, total_masked_tokens=6.0))
    b = reduce(X_AB[2:], token_weights(M_AB[2:], [4], mode="per_token", num_trajectories=2, total_masked_tokens=6.0))
    assert_close(a + b, t(8 / 6), rtol=0, atol=1e-15)
    # the wrong approach (averaging per-micro-batch means) gives 1.5, not 1.3333
    wrong = (X_AB[:2].mean() + X_AB[2:].mean()) / 2
    assert abs(wrong.item() - (a + b).item()) > 0.1


def test_constant_mode_dr_grpo():
    # (sum A + sum B) / (constant_length * N_traj) = (4 + 4) / (8 * 2)
    w = token_weights(M_AB, L_AB, mode="constant", num_trajectories=2, constant_length=8.0)
    assert_close(reduce(X_AB, w), t(8 / 16), rtol=0, atol=1e-15)


def test_per_sample_masks_and_fully_masked_sample():
    # sample 0: x [2, 4, 6] mask [1, 0, 1] -> (2 + 6)/2 = 4; sample 1 fully masked -> 0;
    # sample 2: x [5] -> 5; N_traj = 3 -> (4 + 0 + 5)/3
    x = t([2.0, 4.0, 6.0, 7.0, 7.0, 5.0])
    m = t([1, 0, 1, 0, 0, 1])
    w = token_weights(m, [3, 2, 1], mode="per_sample", num_trajectories=3)
    assert torch.isfinite(w).all()
    assert_close(w, t([1 / 6, 0, 1 / 6, 0, 0, 1 / 3]), rtol=0, atol=1e-15)
    assert_close(reduce(x, w), t((4 + 0 + 5) / 3), rtol=0, atol=1e-14)
    assert_close(sample_mask_sums(m, [3, 2, 1]), t([2, 0, 1]), rtol=0, atol=0)


def test_trajectory_mask_sums_keep_original_denominators():
    # rejection sampling: original mask [1,1,1,1] (D = 4), new mask [1,0,1,0]
    x = t([1.0, 2.0, 3.0, 4.0])
    new = t([1, 0, 1, 0])
    w = token_weights(new, [4], mode="per_sample", num_trajectories=1, trajectory_mask_sums=[4.0])
    assert_close(reduce(x, w), t((1 + 3) / 4), rtol=0, atol=1e-15)
    w_own = token_weights(new, [4], mode="per_sample", num_trajectories=1)
    assert_close(reduce(x, w_own), t((1 + 3) / 2), rtol=0, atol=1e-15)
    with pytest.raises(ValueError):
        token_weights(new, [4], mode="per_sample", num_trajectories=1, trajectory_mask_sums=[4.0, 1.0])


def test_per_token_argument_checks():
    with pytest.raises(ValueError):
        token_weights(M_AB, L_AB, mode="per_token", num_trajectories=2)
    zero = torch.zeros(3, dtype=D)
    assert_close(
        token_weights(zero, [3], mode="per_token", num_trajectories=1, total_masked_tokens=0), zero, rtol=0, atol=0
    )
    with pytest.raises(ValueError):
        token_weights(M_AB, L_AB, mode="per_token", num_trajectories=2, total_masked_tokens=0)
    with pytest.raises(ValueError, match="per_sample"):
        token_weights(M_AB, L_AB, mode="mean", num_trajectories=2)
    with pytest.raises(ValueError):
        token_weights(M_AB, L_AB, mode="constant", num_trajectories=2)
    with pytest.raises(ValueError):
        token_weights(M_AB, [3, 4], mode="per_sample", num_trajectories=2)


# ---------------------------------------------------------------- micro-batch invariance
LENGTHS = [3, 5, 1, 4, 2, 6]


def _batch():
    g = torch.Generator().manual_seed(1234)
    T = sum(LENGTHS)
    feats = torch.randn(T, 4, generator=g, dtype=D)
    old = torch.randn(T, generator=g, dtype=D) * 0.3 - 1.0
    ref = old + torch.randn(T, generator=g, dtype=D) * 0.1
    adv = broadcast_to_tokens(torch.randn(len(LENGTHS), generator=g, dtype=D), LENGTHS)
    mask = (torch.rand(T, generator=g, dtype=D) > 0.3).to(D)
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]
    mask[starts[2] : starts[2] + 1] = 0  # sample 2 fully masked
    mask[starts[4] : starts[4] + 2] = 0  # sample 4 fully masked
    mask[starts[1]] = 1  # guarantee some masked tokens elsewhere
    return feats, old, ref, adv, mask


def _token_loss(theta, feats, old, ref, adv):
    lp = old + 0.5 * torch.tanh(feats @ theta)  # ratios spread over and beyond the clip range
    pg = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0)["loss"]
    return pg + 0.01 * approx_kl(lp, ref, "low_var_kl")


def _step(mode, splits):
    feats, old, ref, adv, mask = _batch()
    theta = torch.tensor([0.9, -1.3, 0.4, 2.0], dtype=D, requires_grad=True)
    n_traj = len(LENGTHS)
    d_full = sample_mask_sums(mask, LENGTHS).tolist()  # fixed at step level
    total = float(mask.sum())
    value = torch.zeros((), dtype=D)
    bounds = [0, *splits, len(LENGTHS)]
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        lens = LENGTHS[s0:s1]
        t0, t1 = sum(LENGTHS[:s0]), sum(LENGTHS[:s1])
        sl = slice(t0, t1)
        w = token_weights(
            mask[sl],
            lens,
            mode=mode,
            num_trajectories=n_traj,
            total_masked_tokens=total,
            trajectory_mask_sums=d_full[s0:s1],
        )
        part = reduce(_token_loss(theta, feats[sl], old[sl], ref[sl], adv[sl]), w)
        part.backward()  # gradient accumulation across micro-batches
        value = value + part.detach()
    return value, theta.grad.clone(), (feats, old, ref, adv, mask, theta)


@pytest.mark.parametrize("mode", ["per_sample", "per_token"])
def test_micro_batch_invariance(mode):
    one, g_one, (feats, old, ref, adv, mask, theta) = _step(mode, [])
    # direct definition (docs/algorithms.md#loss-reduction)
    x = _token_loss(theta.detach(), feats, old, ref, adv)
    if mode == "per_token":
        direct = (x * mask).sum() / mask.sum()
    else:
        per = [
            (xi * mi).sum() / mi.sum() if mi.sum() > 0 else torch.zeros((), dtype=D)
            for xi, mi in zip(torch.split(x, LENGTHS), torch.split(mask, LENGTHS))
        ]
        direct = torch.stack(per).sum() / len(LENGTHS)
    assert_close(one, direct, rtol=0, atol=1e-12)
    assert g_one.abs().sum() > 1e-3  # the gradient is not trivially zero
    for splits in ([3], [1, 3, 4], [1, 2, 3, 4, 5]):
        v, g, _ = _step(mode, splits)
        assert_close(v, one, rtol=0, atol=1e-12)
        assert_close(g, g_one, rtol=0, atol=1e-12)
