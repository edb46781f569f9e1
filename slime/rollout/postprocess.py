"""From a rollout's groups to training data: reward post-processing, per-rank batches, metrics."""

from __future__ import annotations

import statistics

import torch

from slime.algo.estimators import ESTIMATORS
from slime.config.schema import AlgoConfig
from slime.rollout.agent.trajectory import agent_metrics
from slime.types import Sample, SampleStatus, TrainBatch


def post_process_rewards(raw: torch.Tensor, algo: AlgoConfig, n_samples_per_prompt: int) -> torch.Tensor:
    """Per-sample rewards the trainer turns into advantages (docs/algorithms.md#reward-post-processing): the
    estimator's reward transform (`slime.algo.estimators`), or the raw rewards with algo.disable_rewards_normalization.
    Tensor[N] in, Tensor[N] out; groups are n consecutive samples."""
    if algo.disable_rewards_normalization:
        return raw
    return ESTIMATORS.get(algo.advantage_estimator).transform_rewards(raw, n_samples_per_prompt, algo)


def overlong_penalty(
    response_lengths: list[int], *, max_response_len: int, buffer_len: int, factor: float
) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to max − buffer tokens, then falling linearly to −factor at max."""
    expected = max_response_len - buffer_len
    return [-factor * min(max(length - expected, 0) / buffer_len, 1.0) for length in response_lengths]


def split_for_data_parallel(
    samples: list[Sample],
    raw: list[float],
    rewards: list[float],
    *,
    step_sizes: list[int],
    dp_size: int,
    balance_tokens: bool = False,
) -> list[TrainBatch]:
    """Optimizer steps of consecutive samples, `step_sizes[k]` in step k (K steps of G: [G] * K; a step of agent
    turns holds as many as its episodes had, slime.rollout.agent.turn_samples); each step's samples dealt to the DP
    ranks, about G/dp each.

    Dealt round-robin, or with `balance_tokens` longest first to the rank with the fewest tokens so far
    (so ranks that micro-batch by tokens run about the same number of micro-batches). Either way the
    step-level normalisers make losses and gradients independent of the deal. Asserts that nothing is
    dropped (slime silently drops a trailing partial step).
    """
    dp = dp_size
    if len(samples) != sum(step_sizes):
        raise RuntimeError(f"{len(samples)} samples cannot fill steps of {step_sizes}: nothing may be dropped")
    per_rank: list[list[tuple[int, int]]] = [[] for _ in range(dp)]  # (sample position, step)
    masked, first = [], 0
    for step, size in enumerate(step_sizes):
        chunk, first = list(range(first, first + size)), first + size
        masked.append(sum(sum(samples[i].loss_mask) for i in chunk if not samples[i].remove_sample))
        deal = _deal_by_tokens(chunk, samples, dp) if balance_tokens else [j % dp for j in range(len(chunk))]
        for i, rank in zip(chunk, deal):
            per_rank[rank].append((i, step))
    has_engine_log_probs = all(s.rollout_log_probs is not None for s in samples)
    has_routes = all(s.routed_experts is not None for s in samples)
    has_images = any(s.images for s in samples)
    batches = []
    for entries in per_rank:
        pick = [samples[i] for i, _ in entries]
        batches.append(
            TrainBatch(
                tokens=[s.tokens for s in pick],
                response_lengths=[s.response_length for s in pick],
                loss_masks=[[0] * s.response_length if s.remove_sample else list(s.loss_mask) for s in pick],
                rewards=[rewards[i] for i, _ in entries],
                raw_rewards=[raw[i] for i, _ in entries],
                rollout_log_probs=[s.rollout_log_probs for s in pick] if has_engine_log_probs else None,
                truncated=[s.status == SampleStatus.TRUNCATED for s in pick],
                routed_experts=[s.routed_experts for s in pick] if has_routes else None,
                images=[s.images for s in pick] if has_images else None,
                sample_indices=[s.index for s in pick],
                step_ids=[step for _, step in entries],
                num_trajectories_per_step=list(step_sizes),
                masked_tokens_per_step=masked,
            )
        )
    return batches


def _deal_by_tokens(chunk: list[int], samples: list[Sample], dp: int) -> list[int]:
    """The rank of each sample of `chunk`: longest first to the rank with the fewest tokens among those
    still short of len(chunk)/dp samples (ties: the lower rank, then the earlier sample)."""
    capacity = -(-len(chunk) // dp)
    tokens, counts, rank_of = [0] * dp, [0] * dp, [0] * len(chunk)
    for j in sorted(range(len(chunk)), key=lambda j: (-len(samples[chunk[j]].tokens), j)):
        rank = min((r for r in range(dp) if counts[r] < capacity), key=lambda r: (tokens[r], r))
        rank_of[j] = rank
        tokens[rank] += len(samples[chunk[j]].tokens)
        counts[rank] += 1
    return rank_of


def rollout_metrics(groups: list[list[Sample]], raw: torch.Tensor, n: int) -> dict[str, float]:
    """Rollout-side metrics (docs/tracking.md#metrics) over the kept samples."""
    samples = [s for g in groups for s in g]
    lengths = [s.effective_response_length for s in samples]
    metrics = {
        "rollout/raw_reward": float(raw.mean()),
        "rollout/response_len/mean": statistics.fmean(lengths),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/truncated_ratio": statistics.fmean(s.status == SampleStatus.TRUNCATED for s in samples),
        **agent_metrics(samples),
    }
    if n > 1:
        grouped = raw.view(-1, n)
        zero_std = grouped.std(dim=1) <= 1e-6
        for value in sorted({round(float(v), 1) for v in grouped[zero_std, 0]}):
            metrics[f"rollout/zero_std/count_{value}"] = float((grouped[zero_std, 0].round(decimals=1) == value).sum())
    return metrics
