"""Checks that need what the prepare phase made: the model's tokenizer (a generated model's included) and the
generated prompt files. They run after `prepare_assets` and before Ray starts; a problem is a ConfigError
(exit 2, nothing started), as validation's are."""

from __future__ import annotations

from slime.config import ConfigError
from slime.config.schema import RunConfig
from slime.rollout.check_data import check_prompt_lengths


def check_prepared(cfg: RunConfig) -> None:
    """Raise ConfigError naming every problem; `rollout.max_prompt_len` is the only check that needs tokens,
    so the tokenizer is loaded (as the rollout manager loads it) only when it is set."""
    if cfg.rollout.max_prompt_len is None:
        return
    from transformers import AutoTokenizer  # ~9 CPU-seconds with torch, in the driver: only for a length check

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
    problems = list(check_prompt_lengths(cfg, tokenizer))
    if problems:
        raise ConfigError(problems)
