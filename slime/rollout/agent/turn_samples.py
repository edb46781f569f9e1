"""`rollout.agent.samples=turns`: each engine turn of an episode trains as a sample of its own (AReaL's "individual"
export, where `episode` is its "concat").

Turn t's sample is the episode cut where the turn's sampled ids end: its prompt is every id before the turn (the
first prompt, the earlier turns' sampled ids and the ids the gateway added), its response exactly the ids the engine
sampled in that turn, with their loss mask, log-probs and weight versions. Every turn carries its episode's reward
and post-processed reward (one advantage per episode, as the group's normalisation computed it). The trained ids,
their contexts and their advantages are those of the episode: under a per-token loss the step's gradient is the
same; what changes is what counts as a trajectory (`seq-mean` losses average over turns, `train/global_batch_size`
counts turns).

The optimizer steps still partition episodes (`train.global_batch_size` episodes a step); a step then holds the
turns of its episodes.
"""

from __future__ import annotations

import base64
import dataclasses

from slime.types import Sample, SampleStatus

SAMPLES = ("episode", "turns")


def split_turns(sample: Sample) -> list[Sample]:
    """The samples of `sample`'s turns, in turn order; `sample` itself (one) when it has no turns to split (a
    failed episode, or no agent)."""
    agent = sample.metadata.get("agent")
    if sample.remove_sample or not isinstance(agent, dict) or not agent.get("turns"):
        return [sample]
    first = agent["first_prompt_length"]
    turns = agent["turns"]
    out = []
    for number, turn in enumerate(turns):
        start, end = turn["prompt_length"] - first, turn["prompt_length"] + len(turn["sampled"]) - first
        last = number == len(turns) - 1
        piece = dataclasses.replace(
            sample,
            tokens=sample.tokens[: first + end],
            response_length=end - start,
            loss_mask=sample.loss_mask[start:end],
            rollout_log_probs=None if sample.rollout_log_probs is None else sample.rollout_log_probs[start:end],
            token_versions=None if sample.token_versions is None else sample.token_versions[start:end],
            routed_experts=_route_prefix(sample, first + end),
            status=sample.status if last else SampleStatus.COMPLETED,
            response="",
            metadata={**sample.metadata, "agent_turn": number},
        )
        piece.check_alignment()
        out.append(piece)
    return out


def expand_steps(
    samples: list[Sample], raw: list[float], rewards: list[float], *, global_batch_size: int, num_steps: int
) -> tuple[list[Sample], list[float], list[float], list[int]]:
    """(turn samples, their raw and post-processed rewards, samples per optimizer step): `num_steps` steps of
    `global_batch_size` episodes each, every episode replaced by its turns."""
    if len(samples) != global_batch_size * num_steps:
        raise RuntimeError(
            f"{len(samples)} episodes cannot fill {num_steps} steps of {global_batch_size}: nothing may be dropped"
        )
    out, out_raw, out_rewards, step_sizes = [], [], [], []
    for step in range(num_steps):
        size = 0
        for i in range(step * global_batch_size, (step + 1) * global_batch_size):
            pieces = split_turns(samples[i])
            out += pieces
            out_raw += [raw[i]] * len(pieces)
            out_rewards += [rewards[i]] * len(pieces)
            size += len(pieces)
        step_sizes.append(size)
    return out, out_raw, out_rewards, step_sizes


def _route_prefix(sample: Sample, length: int) -> str | None:
    """The MoE routes (base64 of int32 rows, one per token but the last) of the first `length` tokens."""
    if sample.routed_experts is None:
        return None
    data = base64.b64decode(sample.routed_experts)
    row = len(data) // (len(sample.tokens) - 1)
    return base64.b64encode(data[: row * (length - 1)]).decode()
