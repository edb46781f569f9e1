"""Step-level loss/metric reduction independent of micro-batching and DP (docs/algorithms.md#loss-reduction).

Every normaliser (per-sample masked counts D_i, the number of trajectories N_traj, the
step's total masked tokens) is fixed at STEP level before splitting into micro-batches.
``token_weights`` turns them into per-token weights w so that the step value of any
per-token quantity x is Σ over all micro-batches and ranks of ``reduce(x, w)``. Summing
gradients of the micro-batch ``reduce`` results therefore gives the step gradient exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo._layout import check_flat, check_lengths, sample_ids, segment_sum

REDUCTION_MODES: tuple[str, ...] = ("per_sample", "per_token", "constant")


def sample_mask_sums(loss_mask: Tensor, response_lengths: list[int]) -> Tensor:
    """Per-sample masked-token counts D_i: Tensor[T] 0/1 mask -> Tensor[B] (mask dtype)."""
    lengths = check_lengths(response_lengths)
    check_flat(loss_mask, lengths, "loss_mask")
    return segment_sum(loss_mask, lengths)


def token_weights(
    loss_mask: Tensor,
    response_lengths: list[int],
    *,
    mode: str,
    num_trajectories: int,
    total_masked_tokens: float | None = None,
    trajectory_mask_sums: list[float] | None = None,
    constant_length: float | None = None,
) -> Tensor:
    """Per-token reduction weights for one micro-batch (on one rank).

    Modes:
        "per_sample": w = m / (D_i · N_traj); D_i = sample i's masked-token count, or
            ``trajectory_mask_sums[i]`` (the original per-trajectory count) if given.
            Samples with D_i == 0 get weight 0 (no NaN).
        "per_token": w = m / total_masked_tokens (step total over all ranks; required).
        "constant" (Dr.GRPO): w = m / (constant_length · N_traj).

    Args:
        loss_mask: Tensor[T] float 0/1 (may be a rejection-sampled mask).
        num_trajectories: N_traj of the whole step (unused by "per_token").
    Returns:
        Tensor[T] in the mask's dtype, no gradient.
    """
    if mode not in REDUCTION_MODES:
        raise ValueError(f"unknown reduction mode {mode!r}; valid: {', '.join(REDUCTION_MODES)}")
    lengths = check_lengths(response_lengths)
    check_flat(loss_mask, lengths, "loss_mask")
    m = loss_mask.detach()
    if not m.is_floating_point():
        m = m.to(torch.get_default_dtype())
    if mode == "per_token":
        if total_masked_tokens is None or total_masked_tokens < 0:
            raise ValueError(f"per_token mode needs total_masked_tokens >= 0, got {total_masked_tokens}")
        if total_masked_tokens == 0:
            if bool((m != 0).any()):
                raise ValueError("total_masked_tokens is 0 but this micro-batch has masked tokens")
            return torch.zeros_like(m)
        return m / total_masked_tokens
    if num_trajectories < 1:
        raise ValueError(f"num_trajectories must be >= 1, got {num_trajectories}")
    if mode == "constant":
        if constant_length is None or not constant_length > 0:
            raise ValueError(f"constant mode needs constant_length > 0, got {constant_length}")
        return m / (constant_length * num_trajectories)
    if trajectory_mask_sums is None:
        denom = segment_sum(m, lengths)
    else:
        if len(trajectory_mask_sums) != len(lengths):
            raise ValueError(f"trajectory_mask_sums has {len(trajectory_mask_sums)} entries for {len(lengths)} samples")
        denom = torch.tensor(trajectory_mask_sums, dtype=m.dtype, device=m.device)
    per_sample = torch.where(
        denom > 0, 1.0 / (denom.clamp_min(torch.finfo(m.dtype).tiny) * num_trajectories), torch.zeros_like(denom)
    )
    return m * per_sample[sample_ids(lengths, m.device)]


def reduce(values: Tensor, weights: Tensor) -> Tensor:
    """Scalar (values · weights).sum(); values and weights are Tensor[T]."""
    if values.shape != weights.shape:
        raise ValueError(f"shape mismatch: {tuple(values.shape)} vs {tuple(weights.shape)}")
    return (values * weights.to(values.dtype)).sum()
