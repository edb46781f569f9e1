"""Eval datasets (`eval.datasets.<name>`) and the rollout loop's options: ranges, rewards, interplay."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.registry import REWARD_TYPES


def check_eval(cfg: RunConfig) -> Iterator[Problem]:
    e = cfg.eval
    if not e.interval:
        return
    if not e.datasets:
        yield Problem(
            "eval.datasets",
            {},
            f"eval.interval={e.interval} but no eval dataset",
            "add one: +eval.datasets.<name>.prompt_data=<file.jsonl>, or eval=none",
        )
    if e.n_samples_per_prompt <= 0:
        yield Problem("eval.n_samples_per_prompt", e.n_samples_per_prompt, "must be > 0", "set it to 1 or more")
    yield from _sampling("eval", e)
    for name, dataset in e.datasets.items():
        key = f"eval.datasets.{name}"
        if dataset.n_samples_per_prompt is not None and dataset.n_samples_per_prompt <= 0:
            yield Problem(f"{key}.n_samples_per_prompt", dataset.n_samples_per_prompt, "must be > 0", "set it to 1+")
        yield from _sampling(key, dataset)
        rm_type = dataset.rm_type or cfg.rollout.rm_type
        if rm_type is not None and rm_type not in REWARD_TYPES:
            yield Problem(
                f"{key}.rm_type",
                dataset.rm_type,
                REWARD_TYPES.unknown_message(rm_type),
                f"set {key}.rm_type=<one of {', '.join(REWARD_TYPES.names())}>",
            )


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
    if r.mask_offpolicy_in_partial_rollout and not r.partial_rollout:
        yield Problem(
            "rollout.mask_offpolicy_in_partial_rollout",
            True,
            "masks the tokens of continued partial samples, but rollout.partial_rollout=false",
            "set rollout.partial_rollout=true, or rollout.mask_offpolicy_in_partial_rollout=false",
        )
