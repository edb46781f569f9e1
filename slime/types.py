"""Records that cross process boundaries: the rollout `Sample` and its status.

A `Sample` is one response to one prompt (docs/architecture.md#the-sample-record). Token-level fields are plain Python
lists so that a sample pickles cheaply through Ray and serialises to JSON as a dict.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from typing import Any


class SampleStatus(str, enum.Enum):
    """Where a sample stands; stored as its lowercase string value."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @classmethod
    def from_finish_reason(cls, finish_type: str) -> SampleStatus:
        """Map an SGLang `meta_info.finish_reason.type` to a status."""
        mapping = {"stop": cls.COMPLETED, "length": cls.TRUNCATED, "abort": cls.ABORTED}
        if finish_type not in mapping:
            raise ValueError(f"unknown finish_reason type {finish_type!r}; expected one of {sorted(mapping)}")
        return mapping[finish_type]


@dataclasses.dataclass
class Sample:
    """One response record.

    Invariants (checked by `check_alignment`):
      tokens = prompt ids ++ response ids, so len(tokens) = prompt_length + response_length;
      len(loss_mask) = response_length; len(rollout_log_probs) = response_length when present.
    """

    # identity
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    session_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    prompt_index: int | None = None  # the prompt's position in its dataset (same for every epoch)
    epoch: int | None = None  # the data source's epoch when the prompt was drawn
    # input
    prompt: str | list[dict[str, Any]] = ""
    messages: list[dict[str, Any]] | None = None  # the chat messages the prompt was rendered from
    tokens: list[int] = dataclasses.field(default_factory=list)
    label: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    images: list[str] | None = None  # a vision-language prompt's image references, in the prompt's order
    # output
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    # the engine's MoE routes (algo.routing_replay=rollout): base64 of int32 [len(tokens) - 1, MoE layers, top-k],
    # slime.models.moe.routes
    routed_experts: str | None = None
    reward: float | dict[str, Any] | None = None
    status: SampleStatus = SampleStatus.PENDING
    weight_versions: list[str] = dataclasses.field(default_factory=list)  # the engine's, one per engine call
    # per response token: the weight version that generated it (-1: not an engine's, or not an integer version);
    # None until an engine answered. A response spanning a weight push (train.async=full) holds two versions.
    token_versions: list[int] | None = None
    staleness: int | None = None  # trainer weight version minus its oldest token's (rollout/staleness.py)
    error: str | None = None  # why the sample FAILED (e.g. the reward function raised)
    # flags
    remove_sample: bool = False

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Number of response tokens that carry loss (Σ loss_mask)."""
        return int(sum(self.loss_mask)) if self.loss_mask is not None else self.response_length

    def scalar_reward(self, reward_key: str | None = None) -> float:
        """The reward as a float; a dict reward needs `reward_key` to pick its scalar."""
        if self.reward is None:
            raise ValueError(f"sample {self.index} has no reward yet")
        if isinstance(self.reward, dict):
            if reward_key is None or reward_key not in self.reward:
                raise KeyError(
                    f"sample {self.index} has a dict reward with keys {sorted(self.reward)}; "
                    f"set rollout.reward_key to one of them (got {reward_key!r})"
                )
            return float(self.reward[reward_key])
        return float(self.reward)

    def append_response(
        self,
        token_ids: list[int],
        log_probs: list[float],
        text: str,
        loss_mask_value: int = 1,
        weight_version: int | None = None,
    ):
        """Append generated tokens with their engine log-probs, loss mask and (an engine's) weight version."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"got {len(token_ids)} token ids but {len(log_probs)} log-probs")
        if weight_version is not None or self.token_versions is not None:
            known = self.token_versions if self.token_versions is not None else [-1] * self.response_length
            self.token_versions = known + [-1 if weight_version is None else weight_version] * len(token_ids)
        self.tokens.extend(token_ids)
        self.response_length += len(token_ids)
        self.loss_mask = (self.loss_mask or []) + [loss_mask_value] * len(token_ids)
        self.rollout_log_probs = (self.rollout_log_probs or []) + list(log_probs)
        self.response += text

    def check_alignment(self) -> None:
        """Raise ValueError if the token-level fields disagree (docs/architecture.md#alignment-invariants)."""
        if self.response_length < 0 or self.response_length > len(self.tokens):
            raise ValueError(
                f"sample {self.index}: response_length {self.response_length} vs {len(self.tokens)} tokens"
            )
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(loss_mask)={len(self.loss_mask)} != response_length={self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(rollout_log_probs)={len(self.rollout_log_probs)} != response_length={self.response_length}"
            )
        if self.token_versions is not None and len(self.token_versions) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(token_versions)={len(self.token_versions)} != response_length={self.response_length}"
            )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        known = {f.name for f in dataclasses.fields(cls)}
        sample = cls(**{k: v for k, v in data.items() if k in known})
        sample.status = SampleStatus(sample.status)
        for key, value in data.items():  # unknown keys survive as attributes
            if key not in known:
                setattr(sample, key, value)
        return sample


@dataclasses.dataclass
class TrainBatch:
    """One rollout step's training data for ONE data-parallel rank (lists hold one entry per sample).

    Samples are ordered by optimizer step: `step_ids[i]` is the step (0..K-1) sample i belongs to.
    The two normalisers are step-level totals over ALL ranks, fixed before micro-batching, so the
    reduced loss does not depend on how samples are split (docs/algorithms.md#loss-reduction).
    """

    tokens: list[list[int]]  # prompt + response ids
    response_lengths: list[int]  # tokens
    loss_masks: list[list[int]]  # one 0/1 per response token
    rewards: list[float]  # post-processed (e.g. group-normalised) rewards
    raw_rewards: list[float]
    rollout_log_probs: list[list[float]] | None  # engine log-probs per response token
    truncated: list[bool]
    sample_indices: list[int]
    step_ids: list[int]
    num_trajectories_per_step: list[int]  # per optimizer step: its samples over all ranks (G)
    masked_tokens_per_step: list[int]  # Σ loss_mask per optimizer step over all ranks
    routed_experts: list[str] | None = None  # per sample `Sample.routed_experts` (algo.routing_replay=rollout)
    images: list[list[str] | None] | None = None  # per sample `Sample.images` (a vision-language model's prompts)

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, indices: list[int]) -> TrainBatch:
        """A batch of the samples at `indices`, with the same step-level normalisers."""
        pick = lambda values: None if values is None else [values[i] for i in indices]  # noqa: E731
        return TrainBatch(
            tokens=pick(self.tokens),
            response_lengths=pick(self.response_lengths),
            loss_masks=pick(self.loss_masks),
            rewards=pick(self.rewards),
            raw_rewards=pick(self.raw_rewards),
            rollout_log_probs=pick(self.rollout_log_probs),
            truncated=pick(self.truncated),
            routed_experts=pick(self.routed_experts),
            images=pick(self.images),
            sample_indices=pick(self.sample_indices),
            step_ids=pick(self.step_ids),
            num_trajectories_per_step=self.num_trajectories_per_step,
            masked_tokens_per_step=self.masked_tokens_per_step,
        )
