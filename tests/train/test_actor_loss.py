"""The assembled actor loss of every algorithm option is independent of the micro-batch split (float64)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime.algo.kl import approx_kl
from slime.algo.reduction import token_weights
from slime.config.schema import AlgoConfig
from slime.train.actor_loss import actor_loss, reduction_mode

ALGOS = {
    "grpo": AlgoConfig(name="grpo", advantage_estimator="grpo", use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01),
    "dapo": AlgoConfig(name="dapo", advantage_estimator="grpo", eps_clip_high=0.28, calculate_per_token_loss=True),
    "dr_grpo": AlgoConfig(name="dr_grpo", advantage_estimator="grpo", pg_loss_constant_length=8),
    "gspo": AlgoConfig(name="gspo", advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4),
    "dual_clip_tis": AlgoConfig(name="x", advantage_estimator="grpo", eps_clip_c=3.0, use_tis=True, tis_clip=1.5),
    "sft": AlgoConfig(name="sft", advantage_estimator="sft"),
}


def make_batch(seed: int = 0):
    """8 samples of 1..6 tokens; sample 3 fully masked; log-probs that move away from old."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 1, 6, 4, 2, 5, 6, 1]
    total = sum(lengths)
    mask = (torch.rand(total, generator=g, dtype=torch.float64) > 0.2).double()
    start = sum(lengths[:3])
    mask[start : start + lengths[3]] = 0
    theta = (torch.randn(total, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    base = -torch.rand(total, generator=g, dtype=torch.float64) * 2
    return {
        "lengths": lengths,
        "mask": mask,
        "theta": theta,
        "old": base,
        "ref": base + torch.randn(total, generator=g, dtype=torch.float64) * 0.1,
        "rollout": base + torch.randn(total, generator=g, dtype=torch.float64) * 0.05,
        "adv": torch.randn(len(lengths), generator=g, dtype=torch.float64).repeat_interleave(torch.tensor(lengths)),
        "entropy_base": torch.rand(total, generator=g, dtype=torch.float64),
    }


def step_loss(algo: AlgoConfig, data, splits: int):
    """Σ over micro-batches of the weighted micro-batch losses, and the gradient w.r.t. theta."""
    lengths, n = data["lengths"], len(data["lengths"])
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    log_probs_all = data["old"] + data["theta"]
    entropy_all = data["entropy_base"] * (1 + data["theta"])
    total_tokens = float(data["mask"].sum())
    chunk = -(-n // splits)
    total = torch.zeros((), dtype=torch.float64)
    for lo in range(0, n, chunk):
        idx = list(range(lo, min(lo + chunk, n)))
        sl = slice(offsets[idx[0]], offsets[idx[-1] + 1])
        mb_lengths = [lengths[i] for i in idx]
        mask = data["mask"][sl]
        weights = token_weights(
            mask, mb_lengths, mode=reduction_mode(algo), num_trajectories=n, total_masked_tokens=total_tokens
        )
        pg_weights = (
            weights
            if algo.pg_loss_constant_length is None
            else token_weights(
                mask, mb_lengths, mode="constant", num_trajectories=n, constant_length=algo.pg_loss_constant_length
            )
        )
        loss, _ = actor_loss(
            log_probs=log_probs_all[sl],
            old_log_probs=data["old"][sl],
            advantages=data["adv"][sl],
            weights=weights,
            pg_weights=pg_weights,
            algo=algo,
            loss_mask=mask,
            response_lengths=mb_lengths,
            entropy=entropy_all[sl] if algo.entropy_coef else None,
            ref_log_probs=data["ref"][sl],
            rollout_log_probs=data["rollout"][sl],
        )
        total = total + loss
    (grad,) = torch.autograd.grad(total, data["theta"])
    return total.detach(), grad


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_loss_and_gradient_do_not_depend_on_the_split(name):
    algo, data = ALGOS[name], make_batch()
    loss1, grad1 = step_loss(algo, data, 1)
    assert grad1.abs().sum() > 0
    for splits in (2, 4):
        loss, grad = step_loss(algo, data, splits)
        torch.testing.assert_close(loss, loss1, rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, grad1, rtol=1e-6, atol=1e-15)


def test_hand_computed_grpo_loss_with_kl_and_entropy():
    """Two samples: A = [+1 (2 tokens)], B = [−1 (1 token)], per-sample reduction, G = 2.

    ℓ = ℓ_old at the first step, so ρ = 1 and pg_t = −A_t: pg_loss = ((−1 − 1)/2 + (1)/1)/2 = 0.
    kl (k1) = ℓ − ℓ_ref = [0.1, −0.2 | 0.3] -> kl_loss = ((0.1 − 0.2)/2 + 0.3/1)/2 = 0.125.
    entropy [1, 2 | 4] -> entropy_loss = ((1 + 2)/2 + 4)/2 = 2.75.
    loss = 0 − 0.01·2.75 + 0.5·0.125 = 0.035.
    """
    algo = AlgoConfig(name="grpo", advantage_estimator="grpo", use_kl_loss=True, kl_loss_coef=0.5, entropy_coef=0.01)
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    mask = torch.ones(3, dtype=torch.float64)
    weights = token_weights(mask, [2, 1], mode="per_sample", num_trajectories=2)
    loss, metrics = actor_loss(
        log_probs=lp,
        old_log_probs=lp.clone(),
        advantages=torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64),
        weights=weights,
        pg_weights=weights,
        algo=algo,
        loss_mask=mask,
        response_lengths=[2, 1],
        entropy=torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64),
        ref_log_probs=lp - torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64),
    )
    assert float(metrics["pg_loss"]) == pytest.approx(0.0, abs=1e-12)
    assert float(metrics["kl_loss"]) == pytest.approx(0.125, abs=1e-12)
    assert float(metrics["entropy_loss"]) == pytest.approx(2.75, abs=1e-12)
    assert float(loss) == pytest.approx(-0.01 * 2.75 + 0.5 * 0.125, abs=1e-12)
    assert float(metrics["ppo_kl"]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.0


def test_kl_loss_types_are_wired():
    x = torch.tensor([0.1, -0.5], dtype=torch.float64)
    for kl_type in ("k1", "k2", "k3", "low_var_kl"):
        algo = dataclasses.replace(ALGOS["grpo"], kl_loss_type=kl_type, entropy_coef=0.0)
        mask = torch.ones(2, dtype=torch.float64)
        w = token_weights(mask, [2], mode="per_sample", num_trajectories=1)
        _, metrics = actor_loss(
            log_probs=x,
            old_log_probs=x,
            advantages=torch.zeros(2, dtype=torch.float64),
            weights=w,
            pg_weights=w,
            algo=algo,
            loss_mask=mask,
            response_lengths=[2],
            ref_log_probs=torch.zeros(2, dtype=torch.float64),
        )
        assert float(metrics["kl_loss"]) == pytest.approx(
            float(approx_kl(x, torch.zeros(2, dtype=torch.float64), kl_type).mean())
        )
