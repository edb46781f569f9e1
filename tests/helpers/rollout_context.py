"""A served engine for the rollout's tests (a real hf engine behind the real sglang-router), prompts to count, and a
rollout context around it (the default rollout's calls, as the rollout manager builds them)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from types import SimpleNamespace

from slime.config.schema import RolloutConfig, RouterConfig
from slime.engine.client import EngineClient
from slime.engine.router import Router
from slime.registry import REWARD_TYPES
from slime.rollout.base import RolloutContext, RolloutHooks
from slime.rollout.data_source import DataSource, PromptDataset
from slime.rollout.rewards import RewardHub
from tests.helpers.engines import start_engine
from tests.helpers.registry import registered


def parity_reward(response: str, label: str, metadata=None) -> float:
    """1.0 for an even number of characters: about half the samples of a random policy (rm_type "parity", which
    `context` picks, once a test registers it: `register_parity`)."""
    return float(len(response) % 2 == 0)


def register_parity(monkeypatch) -> None:
    """Make rm_type "parity" name `parity_reward` for the test."""
    registered(monkeypatch, REWARD_TYPES, "parity", f"{__name__}.parity_reward")


@contextlib.contextmanager
def served_engine(model_dir, log_dir, **engine_config) -> Iterator[SimpleNamespace]:
    """One hf engine (`engine_config`: HFEngineConfig fields) behind the router: `url` (the router's), `tokenizer`,
    `client` (the engine's control calls)."""
    from transformers import AutoTokenizer

    router = Router.launch(cfg=RouterConfig(startup_timeout_s=120), log_path=log_dir / "router.log")
    engine = None
    try:
        engine = start_engine(model_dir, log_dir, **{"batch_wait_ms": 1.0, **engine_config})
        router.add_worker(engine.url)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        yield SimpleNamespace(url=router.url, tokenizer=tokenizer, client=EngineClient(engine.url))
    finally:
        if engine is not None:
            engine.shutdown()
        router.shutdown()


def count_prompts(tmp_path, tokenizer, name: str, num_prompts: int, n: int) -> DataSource:
    """A data source over `num_prompts` chat prompts "Count to i." (label i), in order, `n` samples each."""
    path = tmp_path / f"{name}.jsonl"
    rows = [{"prompt": f"Count to {i}.", "label": str(i)} for i in range(num_prompts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = PromptDataset(
        str(path),
        tokenizer=tokenizer,
        input_key="prompt",
        label_key="label",
        metadata_key=None,
        apply_chat_template=True,
    )
    return DataSource(dataset, n_samples_per_prompt=n, shuffle=False, seed=0)


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
