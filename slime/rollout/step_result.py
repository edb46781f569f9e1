"""A finished training rollout step made ready to train (the rollout manager's `RolloutProducer.rollout_step`): the
rollout function's groups checked, the rewards shaped and post-processed, and a preview of its samples for the
sample log."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from slime.rollout.base import RolloutContext, RolloutHooks
from slime.rollout.postprocess import overlong_penalty, post_process_rewards
from slime.types import Sample
from slime.vision.images import short_reference


def checked_samples(groups: list[list[Sample]], *, batch_size: int, rollout_id: int) -> list[Sample]:
    """The step's samples, in group order; RuntimeError when the rollout function returned other than
    `batch_size` groups, or a sample index twice (a retried request must replace its sample, never add one)."""
    if len(groups) != batch_size:
        raise RuntimeError(
            f"the rollout function returned {len(groups)} groups, expected rollout.batch_size={batch_size}"
        )
    samples = [s for g in groups for s in g]
    if len({s.index for s in samples}) != len(samples):
        raise RuntimeError(f"rollout {rollout_id}: a sample index appears twice in the rollout function's groups")
    return samples


def step_rewards(
    samples: list[Sample], *, hooks: RolloutHooks, ctx: RolloutContext, algo, rollout
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(raw rewards, post-processed rewards, metrics) as float64 tensors: the rollout.reward_post_process hook's
    (called with `ctx`), or the algorithm's (DAPO's overlong penalty, then its group normalisation,
    docs/algorithms.md) over `rollout`'s reward key and group size."""
    if hooks.reward_post_process is not None:
        raw, rewards = hooks.reward_post_process(ctx, samples)
        return torch.as_tensor(raw, dtype=torch.float64), torch.as_tensor(rewards, dtype=torch.float64), {}
    r = rollout
    raw = torch.tensor([s.scalar_reward(r.reward_key) for s in samples], dtype=torch.float64)
    shaped, metrics = raw, {}
    if algo.overlong_buffer_len:
        penalty = overlong_penalty(
            [s.response_length for s in samples],
            max_response_len=r.max_response_len,
            buffer_len=algo.overlong_buffer_len,
            factor=algo.overlong_penalty_factor,
        )
        shaped = raw + torch.tensor(penalty, dtype=torch.float64)
        metrics["rollout/overlong_penalty"] = float(statistics.fmean(penalty))
    return raw, post_process_rewards(shaped, algo, r.n_samples_per_prompt), metrics


def sample_preview(samples: list[Sample], rollout_id: int, count: int) -> list[dict[str, Any]]:
    """The first `count` samples for the sample log, without their routes (layers x top-k ids per token), as
    SGLang's request dumps leave them out, and with each image reference shortened (`short_reference`: an embedded
    image is megabytes of base64; the rollout dumps keep them whole)."""
    preview = []
    for s in samples[:count]:
        record = {k: v for k, v in s.to_dict().items() if k != "routed_experts"}
        if s.images:
            record["images"] = [short_reference(ref) for ref in s.images]
        preview.append({**record, "rollout_step": rollout_id})
    return preview
