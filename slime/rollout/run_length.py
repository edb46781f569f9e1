"""How many rollout steps a run has, where the config leaves it to its prompt file (train.num_epoch)."""

from __future__ import annotations

from typing import Optional

from slime.config.schema import RunConfig
from slime.rollout.prompt_file import count_records


def rollouts_for_epochs(cfg: RunConfig) -> Optional[int]:
    """train.num_rollout, or num_epoch × records // rollout.batch_size; None when neither can be known."""
    t = cfg.train
    if t.num_rollout is not None:
        return t.num_rollout
    if t.num_epoch is None or cfg.data.prompt_data is None or cfg.rollout.batch_size <= 0:
        return None
    count = count_records(cfg.data.prompt_data)
    return None if count is None else t.num_epoch * count // cfg.rollout.batch_size
