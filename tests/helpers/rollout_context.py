"""A rollout context around a served engine (the default rollout's calls, as the rollout manager builds them)."""

from __future__ import annotations

from slime.config.schema import RolloutConfig
from slime.rollout.base import RolloutContext, RolloutHooks
from slime.rollout.rewards import RewardHub


def context(
    served, *, batch_size, over_sampling, max_new_tokens, hooks=None, rm_type="parity", **config
) -> RolloutContext:
    return RolloutContext(
        config=RolloutConfig(batch_size=batch_size, **config),
        router_url=served.url,
        tokenizer=served.tokenizer,
        batch_size=batch_size,
        over_sampling_batch_size=over_sampling,
        sampling_params={"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        max_in_flight=64,
        rewards=RewardHub(rm_type=rm_type, custom_rm_path=None),
        hooks=hooks or RolloutHooks(),
        max_filter_drops=100,
    )
