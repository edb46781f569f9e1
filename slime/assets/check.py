"""Validation of the run's assets: paths it reads (they must exist, unless the run makes them itself), paths it
writes, the model checkpoint against the model option, and the data generators that make files."""

from __future__ import annotations

import os
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slime.assets.generators import GENERATOR_SHAPE, generated_file
from slime.assets.gguf_source import INSTALL_HINT, missing_for_import
from slime.assets.hf_config_file import read_hf_config
from slime.config.hooks import HookError, load_callable
from slime.config.problems import Problem
from slime.config.schema import ModelConfig, RunConfig
from slime.config.validate_eval import valid_eval_datasets
from slime.models.families import mismatches, unsupported_layout


def generates_checkpoint(model: ModelConfig) -> bool:
    """True when the run builds `model.hf_checkpoint` itself: the option's own `generate_at`, and only there."""
    if model.generate_at is None:
        return False
    return Path(model.hf_checkpoint).expanduser().resolve() == Path(model.generate_at).expanduser().resolve()


def check_paths(cfg: RunConfig) -> Iterator[Problem]:
    """Paths that must exist; those the run generates itself on first use are exempt."""
    generated = generated_files(cfg)
    for model in (cfg.model, cfg.teacher):
        if model is not None and generates_checkpoint(model):
            generated.add(model.hf_checkpoint)
    candidates = [
        ("checkpoint.load", cfg.checkpoint.load, None),
        ("train.critic.load", cfg.train.critic.load, None),
        ("data.prompt_data", cfg.data.prompt_data, cfg.data.generator),
    ]
    if cfg.eval.interval:
        for name, dataset in valid_eval_datasets(cfg).items():
            candidates.append((f"eval.datasets.{name}.prompt_data", dataset.prompt_data, dataset.generator))
    # ref_load defaults to the policy checkpoint, which check_model_checkpoint reports when it is missing.
    for key, path, _ in other_checkpoints(cfg):
        candidates.append((key, path, None))
    for key, path, generator in candidates:
        if path is None or path in generated:
            continue
        if not Path(_strip_slice(path)).exists():
            hint = ""
            if isinstance(generator, dict) and isinstance(generator.get("path"), str):
                hint = f" (the generator writes {generator['path']} only)"
            yield Problem(
                key,
                path,
                f"path does not exist{hint}",
                f"point {key} at an existing path (absolute paths are safest)",
                machine=True,
            )
    if cfg.data.prompt_data is None and cfg.debug.load_rollout_data is None:
        yield Problem(
            "data.prompt_data",
            None,
            "no prompt data",
            "set data.prompt_data=<file.jsonl> (your prompts) or pick data=digit_task (the synthetic task)",
            machine=True,  # an input the launch needs, not a mistake: the dry run lists it as still needed
        )
    yield from check_save_hf(cfg)
    yield from check_model_checkpoint(cfg)
    yield from check_other_checkpoints(cfg)
    yield from check_writable(cfg)


def check_writable(cfg: RunConfig) -> Iterator[Problem]:
    """Directories the run creates and writes: each must be creatable here (no file in the way, writable
    parent), or the run would fail at its first save, hours in."""
    targets = [
        ("paths.output_dir", cfg.paths.output_dir),
        ("checkpoint.save", cfg.checkpoint.save),
        ("train.critic.save", cfg.train.critic.save),
        ("checkpoint.save_hf", _first_export(cfg.checkpoint.save_hf)),
    ]
    # what the prepare phase writes, under paths.cache_dir by default (a shared cache that holds it is read only)
    for key, model in (("model", cfg.model), ("teacher", cfg.teacher)):
        if model is not None and generates_checkpoint(model) and not Path(model.hf_checkpoint).exists():
            targets.append((f"{key}.generate_at", model.generate_at))
    for key, prompt_data, generator in generator_outputs(cfg):
        path = generated_file(prompt_data, generator)
        if path is not None and not Path(path).exists():
            targets.append((f"{key}.path", str(Path(path).parent)))
    for key, path in targets:
        if path is None:
            continue
        target = Path(path)
        existing = next(p for p in (target, *target.parents) if p.exists())
        if not existing.is_dir():
            what = f"{existing} is a file, not a directory" if existing != target else "a file, not a directory"
            yield Problem(key, path, what, f"point {key} at a directory", machine=True)
        elif not os.access(existing, os.W_OK | os.X_OK):
            yield Problem(key, path, f"{existing} is not writable by this user", f"point {key} elsewhere", machine=True)


def generator_outputs(cfg: RunConfig) -> list[tuple[str, str | None, Any]]:
    """(generator key, the prompt file read, generator node) of the training data and every eval dataset."""
    outputs = [("data.generator", cfg.data.prompt_data, cfg.data.generator)]
    if cfg.eval.interval:
        for name, dataset in valid_eval_datasets(cfg).items():
            outputs.append((f"eval.datasets.{name}.generator", dataset.prompt_data, dataset.generator))
    return outputs


def generated_files(cfg: RunConfig) -> set[str]:
    """Every prompt file a generator of this run writes before it starts: another dataset may read it too (an
    eval set sampled greedily and at temperature, say), and needs no generator of its own."""
    outputs = (generated_file(prompt_data, generator) for _, prompt_data, generator in generator_outputs(cfg))
    return {path for path in outputs if path is not None}


def _first_export(template: str | None) -> str | None:
    """checkpoint.save_hf's first directory; None when there is none or the template is bad (check_save_hf)."""
    try:
        return None if template is None else template.format(rollout_id=0)
    except (ValueError, KeyError, IndexError):
        return None


def _strip_slice(path: str) -> str:
    """`file.jsonl@[0:100]` names rows of file.jsonl (docs/data-and-rewards.md#prompt-files)."""
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
    """The model option against `hf_checkpoint/config.json`: every architecture field (slime.models.families)."""
    m = cfg.model
    if generates_checkpoint(m):
        if m.import_gguf is None:
            return  # generated from these very fields before the run starts, again when stale (slime.assets.prepare)
        if not Path(m.hf_checkpoint).exists():
            yield from _check_gguf_source(m)  # imported before the run starts; checked below once it is there
            return
    config_file = Path(m.hf_checkpoint) / "config.json"
    if not Path(m.hf_checkpoint).exists():
        yield Problem(
            "model.hf_checkpoint",
            m.hf_checkpoint,
            "no such directory" + _generated_elsewhere(m),
            "download the HF checkpoint to a directory and set model.hf_checkpoint=<dir> (absolute paths are safest)",
            machine=True,
        )
        return
    if not config_file.exists():
        yield Problem(
            "model.hf_checkpoint",
            m.hf_checkpoint,
            "no config.json there" + _generated_elsewhere(m),
            "download the HF checkpoint to that directory and set model.hf_checkpoint=<dir>",
            machine=True,
        )
        return
    actual = read_hf_config(m.hf_checkpoint)
    for field_name, ours, theirs in mismatches(m, actual):
        yield Problem(
            f"model.{field_name}",
            ours,
            f"{config_file} says {theirs!r}",
            f"set model.{field_name}={'null' if theirs is None else theirs} or pick the model option matching "
            "the checkpoint",
        )
    layout = unsupported_layout(actual)
    if layout:
        yield Problem("model.hf_checkpoint", m.hf_checkpoint, f"{config_file}: {layout}", "use another checkpoint")


def _check_gguf_source(m: ModelConfig) -> Iterator[Problem]:
    missing = missing_for_import(m.import_gguf)
    if missing:
        yield Problem(
            "model.import_gguf",
            m.import_gguf,
            f"model={m.name} is imported on first use from a GGUF file, and {', '.join(missing)} is not installed",
            INSTALL_HINT,
        )


def _is_torch_dist_root(path: Path) -> bool:
    """A megatron torch_dist checkpoint root: its tracker, a converted `release/`, or an `iter_` directory."""
    return path.is_dir() and (
        (path / "latest_checkpointed_iteration.txt").exists()
        or any(
            child.is_dir() and (child.name == "release" or child.name.startswith("iter_")) for child in path.iterdir()
        )
    )


def _generated_elsewhere(model: ModelConfig) -> str:
    if model.generate_at is None:
        return ""
    return (
        f" (model={model.name} generates its random-weight model only at model.generate_at={model.generate_at}: "
        "drop the model.hf_checkpoint override to use it)"
    )


def other_checkpoints(cfg: RunConfig) -> list[tuple[str, str, bool]]:
    """(key, HF directory, whether it must have the policy's architecture) of every model checkpoint the run
    reads besides model.hf_checkpoint: the reference model, the distillation teacher (unless the run makes it),
    and served models with their own path (one that receives the policy's weights must take them)."""
    found = []
    if cfg.checkpoint.ref_load not in (None, cfg.model.hf_checkpoint):
        found.append(("checkpoint.ref_load", cfg.checkpoint.ref_load, True))
    if cfg.teacher is not None and not generates_checkpoint(cfg.teacher):
        found.append(("teacher.hf_checkpoint", cfg.teacher.hf_checkpoint, True))
    for i, served in enumerate(cfg.rollout.models):
        if served.model_path not in (None, cfg.model.hf_checkpoint):
            found.append((f"rollout.models[{i}].model_path", served.model_path, served.update_weights))
    return found


def check_other_checkpoints(cfg: RunConfig) -> Iterator[Problem]:
    """Each holds an HF config.json (the reference model may be a torch_dist root instead); the reference model
    and weight-receiving served models match model.*."""
    for key, path, policy_shaped in other_checkpoints(cfg):
        config_file = Path(path) / "config.json"
        if not Path(path).exists():
            continue  # check_paths says so
        if key == "checkpoint.ref_load" and _is_torch_dist_root(Path(path)):
            continue  # the megatron backend reads its weights too (slime.train.megatron.checkpoint.load_weights)
        if not config_file.exists():
            yield Problem(key, path, "no config.json there: not an HF checkpoint directory", f"point {key} at one")
            continue
        if policy_shaped:
            for field_name, ours, theirs in mismatches(cfg.model, read_hf_config(path)):
                yield Problem(
                    key,
                    path,
                    f"{config_file} says {field_name}={theirs!r}, the policy (model.{field_name}) has {ours!r}",
                    f"point {key} at a checkpoint of the policy's architecture",
                )


def check_generators(cfg: RunConfig) -> Iterator[Problem]:
    """`data.generator` and every eval dataset's generator."""
    yield from check_generator("data.generator", cfg.data.generator)
    for name, dataset in valid_eval_datasets(cfg).items():
        yield from check_generator(f"eval.datasets.{name}.generator", dataset.generator)


def check_generator(key: str, generator: Any) -> Iterator[Problem]:
    """A generator is a `_target_` node that names its output file in `path`."""
    if generator is None:
        return
    if not isinstance(generator, dict) or not isinstance(generator.get("_target_"), str):
        yield Problem(
            key,
            generator,
            "expected a node {_target_: module.fn, path: <file>, ...}",
            f"set {key}._target_ and {key}.path, or {key}=null",
        )
        return
    if not isinstance(generator.get("path"), str):
        yield Problem(
            f"{key}.path",
            generator.get("path"),
            "a generator names the one file it writes",
            f"set {key}.path=<file> (and point prompt_data at it)",
        )
        return
    try:
        load_callable(generator, key=key, **GENERATOR_SHAPE)
    except HookError as exc:
        yield exc.problem("give a node whose _target_ is importable and whose keys are its parameters, or null")
