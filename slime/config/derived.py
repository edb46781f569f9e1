"""Values derived from the config (`Derived`, computed by slime/plan/derive.py and printed at start-up), and
writing them back into the config so the saved config.yaml is complete."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from slime.config.resume import resolve_resume
from slime.config.schema import RunConfig
from slime.config.validate_eval import eval_dataset


@dataclasses.dataclass(frozen=True, kw_only=True)
class Derived:
    """Resource and batch arithmetic of a run. GPU counts mean CPU bundles when cluster.device=cpu."""

    actor_gpus: int
    critic_gpus: int
    rollout_gpus: int
    total_gpus: int  # what the placement group reserves
    dp_size: int  # data-parallel ranks of the actor
    samples_per_rollout: int  # B_p · n
    global_batch_size: int  # G, samples per optimizer step (all DP ranks)
    samples_per_dp_rank: int  # G / dp, per optimizer step
    num_rollout: Optional[int]  # train.num_rollout, or derived from train.num_epoch (None: unknown, reported)
    num_optimizer_steps: int  # num_rollout · K
    over_sampling_batch_size: int  # groups per refill
    hf_max_batch_size: int  # sequences the hf engine decodes together (deterministic: batch-invariant, or 1)
    precision: str  # fp32 | bf16
    rollout_function: Optional[Any]  # import path (or node) rollout.function selects (None: an unknown name, reported)

    def table(self) -> list[tuple[str, str]]:
        return [(f.name, str(getattr(self, f.name))) for f in dataclasses.fields(self)]


def fill_derived(cfg: RunConfig, derived: Derived) -> RunConfig:
    """Write derived defaults back into the config, so the saved config.yaml is complete."""
    cfg.train.global_batch_size = derived.global_batch_size
    cfg.train.num_rollout = derived.num_rollout
    cfg.train.precision = derived.precision
    cfg.rollout.over_sampling_batch_size = derived.over_sampling_batch_size
    cfg.rollout.hf.max_batch_size = derived.hf_max_batch_size
    cfg.rollout.function = derived.rollout_function
    fill_eval_datasets(cfg)
    if cfg.checkpoint.save is None:
        cfg.checkpoint.save = f"{cfg.paths.output_dir}/checkpoints"
    resolve_resume(cfg)
    return cfg


def fill_eval_datasets(cfg: RunConfig) -> None:
    """Each eval dataset's null fields: the eval default, then the rollout's (keys: the data's)."""
    e, r, d = cfg.eval, cfg.rollout, cfg.data
    inherited = {
        "input_key": d.input_key,
        "label_key": d.label_key,
        "metadata_key": d.metadata_key,
        "n_samples_per_prompt": e.n_samples_per_prompt,
        "temperature": e.temperature if e.temperature is not None else r.temperature,
        "top_p": e.top_p if e.top_p is not None else r.top_p,
        "top_k": e.top_k if e.top_k is not None else r.top_k,
        "max_response_len": e.max_response_len if e.max_response_len is not None else r.max_response_len,
        "rm_type": r.rm_type,
        "reward_key": r.reward_key,
    }
    e.datasets = {name: eval_dataset(name, node) for name, node in e.datasets.items()}
    for dataset in e.datasets.values():
        for name, value in inherited.items():
            if getattr(dataset, name) is None:
                setattr(dataset, name, value)
