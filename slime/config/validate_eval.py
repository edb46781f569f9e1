"""Eval datasets (`eval.datasets.<name>`) and the rollout loop's options: ranges and interplay (an eval
dataset's reward type is checked against the registry by slime/rollout/check_rewards.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slime.config.problems import Problem, did_you_mean
from slime.config.schema import EvalDatasetConfig, RunConfig

DATASET_FIELDS = [f.name for f in dataclasses.fields(EvalDatasetConfig)]


def eval_dataset(name: str, node: Any) -> EvalDatasetConfig | Problem:
    """`eval.datasets.<name>` as an EvalDatasetConfig, or the Problem naming its bad key."""
    key = f"eval.datasets.{name}"
    if isinstance(node, EvalDatasetConfig):
        return node
    if not isinstance(node, dict):
        return Problem(key, node, "expected a node of dataset fields", f"set {key}.prompt_data=<file.jsonl>")
    for field_name in node:
        if field_name not in DATASET_FIELDS:
            return Problem(
                f"{key}.{field_name}",
                node[field_name],
                f"not a dataset field{did_you_mean(str(field_name), DATASET_FIELDS)}; fields: {', '.join(DATASET_FIELDS)}",
                f"remove {key}.{field_name} or use one of those fields",
            )
    if node.get("prompt_data") is None:
        return Problem(f"{key}.prompt_data", None, "an eval dataset needs its prompts", f"set {key}.prompt_data=<file>")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalDatasetConfig), node))
    except OmegaConfBaseException as exc:
        return Problem(
            f"{key}.{exc.key}",
            getattr(exc, "value", None),
            str(exc).splitlines()[0],
            "give a value of the field's type",
        )


def valid_eval_datasets(cfg: RunConfig) -> dict[str, EvalDatasetConfig]:
    """The eval datasets that convert (a bad entry is reported by `check_eval`)."""
    datasets = {name: eval_dataset(name, node) for name, node in cfg.eval.datasets.items()}
    return {name: d for name, d in datasets.items() if isinstance(d, EvalDatasetConfig)}


def check_eval(cfg: RunConfig) -> Iterator[Problem]:
    e = cfg.eval
    if not e.interval:
        return
    if not e.datasets:
        yield Problem(
            "eval.datasets",
            {},
            f"eval.interval={e.interval} but no eval dataset",
            "add one: +eval.datasets.<name>.prompt_data=<file.jsonl>, or set eval.interval=null",
        )
    if e.n_samples_per_prompt <= 0:
        yield Problem("eval.n_samples_per_prompt", e.n_samples_per_prompt, "must be > 0", "set it to 1 or more")
    yield from _sampling("eval", e)
    for name, node in e.datasets.items():
        key, dataset = f"eval.datasets.{name}", eval_dataset(name, node)
        if isinstance(dataset, Problem):
            yield dataset
            continue
        if dataset.n_samples_per_prompt is not None and dataset.n_samples_per_prompt <= 0:
            yield Problem(f"{key}.n_samples_per_prompt", dataset.n_samples_per_prompt, "must be > 0", "set it to 1+")
        yield from _sampling(key, dataset)


def _sampling(key: str, node) -> Iterator[Problem]:
    if node.temperature is not None and node.temperature <= 0:
        yield Problem(f"{key}.temperature", node.temperature, "must be > 0", f"set {key}.temperature=0.1 or null")
    if node.top_p is not None and not 0 < node.top_p <= 1:
        yield Problem(f"{key}.top_p", node.top_p, "must be in (0, 1]", f"set {key}.top_p=1.0 or null")
    if node.max_response_len is not None and node.max_response_len <= 0:
        yield Problem(f"{key}.max_response_len", node.max_response_len, "must be > 0", f"set {key}.max_response_len")


def check_rollout_loop(cfg: RunConfig) -> Iterator[Problem]:
    r = cfg.rollout
    if r.max_turns <= 0:
        yield Problem("rollout.max_turns", r.max_turns, "must be > 0", "set rollout.max_turns=1 or more")
    if r.mask_offpolicy_in_partial_rollout and not r.partial_rollout and not cfg.train.is_fully_async:
        yield Problem(
            "rollout.mask_offpolicy_in_partial_rollout",
            True,
            "masks the tokens of continued partial samples, but rollout.partial_rollout=false",
            "set rollout.partial_rollout=true (or train.async=full, which continues samples across pushes), or "
            "rollout.mask_offpolicy_in_partial_rollout=false",
        )
