"""Paths a run reads (they must exist, unless the run makes them itself) and paths it writes."""

from __future__ import annotations

import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from slime.config.problems import Problem
from slime.config.schema import RunConfig


def generated_file(prompt_data: Optional[str], generator: Any) -> Optional[str]:
    """The file a data generator will write for this run: its own `path`, when prompt_data is exactly that
    path; None otherwise (the generator then runs for nothing and writes nothing)."""
    if prompt_data is None or not isinstance(generator, dict) or generator.get("path") != prompt_data:
        return None
    return prompt_data


def check_paths(cfg: RunConfig) -> Iterator[Problem]:
    """Paths that must exist; those the run generates itself on first use are exempt."""
    generated = {cfg.model.hf_checkpoint} if cfg.model.create_if_missing else set()
    candidates = [
        ("checkpoint.load", cfg.checkpoint.load, None),
        ("train.critic.load", cfg.train.critic.load, None),
        ("data.prompt_data", cfg.data.prompt_data, cfg.data.generator),
        ("eval.prompt_data", cfg.eval.prompt_data if cfg.eval.interval else None, cfg.eval.generator),
    ]
    # ref_load defaults to the policy checkpoint, which check_model_checkpoint reports when it is missing.
    if cfg.checkpoint.ref_load != cfg.model.hf_checkpoint:
        candidates.append(("checkpoint.ref_load", cfg.checkpoint.ref_load, None))
    for key, path, generator in candidates:
        if path is None or path in generated or generated_file(path, generator):
            continue
        if not Path(_strip_slice(path)).exists():
            hint = ""
            if isinstance(generator, dict) and isinstance(generator.get("path"), str):
                hint = f" (the generator writes {generator['path']} only)"
            yield Problem(
                key, path, f"path does not exist{hint}", f"point {key} at an existing path (absolute paths are safest)"
            )
    if cfg.data.prompt_data is None and cfg.debug.load_rollout_data is None:
        yield Problem(
            "data.prompt_data",
            None,
            "no prompt data",
            "set data.prompt_data=<file.jsonl> (your prompts) or pick data=digit_task (the synthetic task)",
        )
    if cfg.eval.interval and cfg.eval.prompt_data is None:
        yield Problem(
            "eval.prompt_data",
            None,
            f"eval.interval={cfg.eval.interval} but no eval prompts",
            "set eval.prompt_data=<file.jsonl>, or eval=none",
        )
    yield from check_save_hf(cfg)
    yield from check_model_checkpoint(cfg)


def _strip_slice(path: str) -> str:
    """`file.jsonl@[0:100]` names rows of file.jsonl (REFERENCE.md §5.1)."""
    return path.split("@[", 1)[0]


def check_save_hf(cfg: RunConfig) -> Iterator[Problem]:
    """checkpoint.save_hf is a directory template with exactly the field {rollout_id} (one export per save)."""
    template = cfg.checkpoint.save_hf
    if template is None:
        return
    fix = "set checkpoint.save_hf=<dir>/iter_{rollout_id:07d} (str.format; one directory per save), or null"
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        template.format(rollout_id=0)
    except (ValueError, KeyError, IndexError) as exc:
        yield Problem(
            "checkpoint.save_hf", template, f"not a valid directory template ({type(exc).__name__}: {exc})", fix
        )
        return
    if fields != {"rollout_id"}:
        other = sorted(fields - {"rollout_id"})
        what = (
            f"has fields {other} besides {{rollout_id}}"
            if other
            else "has no {rollout_id}: every save would overwrite the last"
        )
        yield Problem("checkpoint.save_hf", template, what, fix)


def check_model_checkpoint(cfg: RunConfig) -> Iterator[Problem]:
    from slime.assets.tiny_model import hf_config_dict, read_hf_config

    m = cfg.model
    if m.create_if_missing:
        return  # generated from these very fields before the run starts (slime.assets.prepare)
    config_file = Path(m.hf_checkpoint) / "config.json"
    if not config_file.exists():
        yield Problem(
            "model.hf_checkpoint",
            m.hf_checkpoint,
            "no config.json there",
            "download the HF checkpoint to that directory and set model.hf_checkpoint=<dir>",
        )
        return
    actual = read_hf_config(m.hf_checkpoint)
    expected = hf_config_dict(m, eos_token_id=0, pad_token_id=0) if m.architecture == "qwen3" else {}
    names = {
        "hidden_size": "hidden_size",
        "intermediate_size": "ffn_hidden_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_query_groups",
        "head_dim": "kv_channels",
        "vocab_size": "vocab_size",
        "rms_norm_eps": "norm_epsilon",
        "rope_theta": "rotary_base",
        "tie_word_embeddings": "tie_word_embeddings",
    }
    for hf_key, our_key in names.items():
        if hf_key in actual and hf_key in expected and actual[hf_key] != expected[hf_key]:
            yield Problem(
                f"model.{our_key}",
                getattr(m, our_key),
                f"{config_file} has {hf_key}={actual[hf_key]}",
                f"set model.{our_key}={actual[hf_key]} or pick the model option matching the checkpoint",
            )
