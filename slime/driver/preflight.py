"""Checks that need what the prepare phase made: the model's tokenizer (a generated model's included) and the
generated prompt files. They run after `prepare_assets` and before Ray starts; a problem is a ConfigError (exit 2,
nothing started), as validation's are. The chat template check runs in validation too, where the checkpoint
already exists; here it covers the checkpoint the prepare phase generated."""

from __future__ import annotations

from slime.config import ConfigError
from slime.config.schema import RunConfig
from slime.rollout.check_data import check_prompt_lengths
from slime.rollout.check_template import check_chat_template


def check_prepared(cfg: RunConfig) -> None:
    """Raise ConfigError naming every problem; `rollout.max_prompt_len` is the only check that needs tokens,
    so the tokenizer is loaded (as the rollout manager loads it) only when it is set."""
    problems = list(check_chat_template(cfg))
    if not problems and cfg.rollout.max_prompt_len is not None:
        from transformers import AutoTokenizer  # ~9 CPU-seconds with torch, in the driver: only for a length check

        problems = list(check_prompt_lengths(cfg, AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)))
    if problems:
        raise ConfigError(problems)
