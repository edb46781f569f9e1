"""Data and rollout dumps: checked before anything starts (exit 2 on a problem).

data.prompt_data         every record read and checked (file:line of the first bad one); eval datasets too
train.num_rollout/epoch  exactly one of them; num_epoch derives num_rollout from the record count
data.source_class        importable, a DataSourceBase, built as cls(dataset, n_samples_per_prompt=, ...)
debug.load_rollout_data  a directory holding <rollout_id>.jsonl for every rollout of the run; no eval;
                         required by debug=train_only; debug=rollout_only: no dumps, colocation or checkpoint.load
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slime.assets.check import generated_files
from slime.config.hooks import HookError, load_callable
from slime.config.problems import Problem
from slime.config.schema import DataConfig, RunConfig
from slime.config.validate_eval import valid_eval_datasets
from slime.rollout.data_source import PromptDataset, PromptsTooLong
from slime.rollout.prompt_file import DataFileError, RecordKeys, read_records, split_slice
from slime.rollout.run_length import rollouts_for_epochs

DATA_SOURCE_METHODS = ("get_groups", "add_groups", "state_dict", "load_state_dict", "__len__")


def record_keys(d: DataConfig) -> RecordKeys:
    return RecordKeys(
        input_key=d.input_key,
        label_key=d.label_key,
        metadata_key=d.metadata_key,
        tool_key=d.tool_key,
        image_key=d.multimodal_keys.get("image"),
    )


def check_data(cfg: RunConfig) -> Iterator[Problem]:
    d = cfg.data
    generated = generated_files(cfg)
    for key, path, data, _ in prompt_files(cfg):  # eval files now, not at the first eval hours in
        if path not in generated:
            yield from check_prompt_file(key, path, record_keys(data))
    yield from _check_num_rollout(cfg)
    if d.source_class is not None:
        yield from _check_source_class(d.source_class)
    yield from _check_dumps(cfg)


def prompt_files(cfg: RunConfig) -> list[tuple[str, str, DataConfig, Any]]:
    """(config key, path, the DataConfig it is read with, its generator) of every prompt file the run reads."""
    d = cfg.data
    files = [] if d.prompt_data is None else [("data.prompt_data", d.prompt_data, d, d.generator)]
    if cfg.eval.interval:
        for name, dataset in valid_eval_datasets(cfg).items():
            data = dataclasses.replace(
                cfg.data,
                input_key=dataset.input_key or cfg.data.input_key,
                label_key=dataset.label_key or cfg.data.label_key,
                metadata_key=dataset.metadata_key or cfg.data.metadata_key,
            )
            files.append((f"eval.datasets.{name}.prompt_data", dataset.prompt_data, data, dataset.generator))
    return files


def check_prompt_lengths(cfg: RunConfig, tokenizer) -> Iterator[Problem]:
    """`rollout.max_prompt_len` against every prompt file, measured as the rollout will (`PromptDataset`:
    templated, without special tokens; a custom data.source_class is not built here): a file it empties would
    stop the run after the engines started. Needs the model's tokenizer and the generated files, so it runs after
    the prepare phase (slime.driver.preflight)."""
    limit = cfg.rollout.max_prompt_len
    if limit is None or limit <= 0 or cfg.debug.load_rollout_data is not None:
        return
    for key, path, data, _ in prompt_files(cfg):
        try:
            PromptDataset.from_data_config(data, path, tokenizer=tokenizer, max_prompt_len=limit)
        except PromptsTooLong as exc:
            yield Problem(
                "rollout.max_prompt_len",
                limit,
                f"drops every prompt of {key}={path}: all {exc.count} are longer (templated: {exc.shortest} to "
                f"{exc.longest} tokens)",
                f"raise rollout.max_prompt_len to at least {exc.shortest}, or set it to null (no limit)",
            )


def check_prompt_file(key: str, path: str, keys: RecordKeys) -> Iterator[Problem]:
    """The file's records, all checked; a missing file is check_paths' to report."""
    try:
        if not Path(split_slice(path, key=key)[0]).exists():
            return
        read_records(path, keys, key=key)
    except DataFileError as exc:
        yield Problem(exc.key, path, str(exc), exc.fix)


def _check_num_rollout(cfg: RunConfig) -> Iterator[Problem]:
    t = cfg.train
    if t.num_rollout is not None and t.num_epoch is not None:
        yield Problem(
            "train.num_epoch",
            t.num_epoch,
            f"train.num_rollout={t.num_rollout} is set too; one of them sizes the run",
            "set train.num_rollout=null to derive it from train.num_epoch, or train.num_epoch=null",
        )
    elif t.num_rollout is None and t.num_epoch is None:
        yield Problem(
            "train.num_rollout", None, "the run's length is not set", "set train.num_rollout or train.num_epoch"
        )
    elif t.num_rollout is None and t.num_epoch > 0:  # <= 0: check_ranges reports it
        if cfg.data.prompt_data is None:
            yield Problem(
                "train.num_epoch",
                t.num_epoch,
                "an epoch is a pass over data.prompt_data, which is not set",
                "set data.prompt_data, or train.num_rollout instead",
                machine=True,  # known once the prompt data is given: the dry run lists it as still needed
            )
        elif rollouts_for_epochs(cfg) == 0:
            yield Problem(
                "train.num_epoch",
                t.num_epoch,
                f"{t.num_epoch} epoch(s) of {cfg.data.prompt_data} hold fewer prompts than one rollout step "
                f"(rollout.batch_size={cfg.rollout.batch_size})",
                "raise train.num_epoch or lower rollout.batch_size",
            )
        elif cfg.algo.dynamic_filter is not None:
            yield Problem(
                "train.num_epoch",
                t.num_epoch,
                f"algo.dynamic_filter={cfg.algo.dynamic_filter} drops groups, which use up prompts: "
                f"{t.num_epoch} epoch(s) may fill fewer rollout steps than the {rollouts_for_epochs(cfg)} derived from them",
                "set train.num_rollout=<steps> and train.num_epoch=null (the data source then runs through "
                "epochs as long as the run asks), or algo.dynamic_filter=null",
            )


def _check_source_class(spec: str) -> Iterator[Problem]:
    key = "data.source_class"
    fix = "give the import path of a slime.rollout.data_source.DataSourceBase subclass, or null"
    try:
        cls = load_callable(spec, key=key, signature=("dataset",), keywords=("n_samples_per_prompt", "shuffle", "seed"))
    except HookError as exc:
        yield exc.problem(fix)
        return
    missing = [m for m in DATA_SOURCE_METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        what = f"lacks {', '.join(missing)}" if missing else "is not a class"
        yield Problem(key, spec, f"{what}; a data source implements {', '.join(DATA_SOURCE_METHODS)}", fix)


def _check_debug_modes(cfg: RunConfig) -> Iterator[Problem]:
    """debug=rollout_only (no trainer) and debug=train_only (no engines: dumps required)."""
    d, key = cfg.debug, "debug.load_rollout_data"
    if d.train_only and d.load_rollout_data is None:
        yield Problem(
            key,
            None,
            "debug=train_only starts no engines and trains from rollout dumps: it needs their directory",
            f"set {key}=<a run dir>/rollout_data (written by a run with debug.save_rollout_data=true)",
        )
    if not d.rollout_only:
        return
    if d.train_only or d.load_rollout_data is not None:
        conflict = "debug.train_only=true" if d.train_only else f"{key}={d.load_rollout_data}"
        yield Problem("debug.rollout_only", True, f"conflicts with {conflict}", "pick one debug mode")
    if cfg.cluster.colocate:
        yield Problem(
            "cluster.colocate",
            True,
            "debug=rollout_only starts no trainer to share the GPUs with",
            "set cluster.colocate=false",
        )
    if cfg.checkpoint.load is not None:
        yield Problem(
            "checkpoint.load",
            cfg.checkpoint.load,
            "debug=rollout_only starts no trainer to load it into: the engines serve model.hf_checkpoint",
            "set checkpoint.load=null (or model.hf_checkpoint to an HF export of that checkpoint)",
        )
    if d.check_weight_update_equal:
        yield Problem(
            "debug.check_weight_update_equal",
            True,
            "debug=rollout_only pushes no weights to check: the check would leave the engines' weights random",
            "set debug.check_weight_update_equal=false",
        )


def _check_dumps(cfg: RunConfig) -> Iterator[Problem]:
    yield from _check_debug_modes(cfg)
    source: Any = cfg.debug.load_rollout_data
    if source is None:
        return
    key = "debug.load_rollout_data"
    if not Path(source).is_dir():
        yield Problem(key, source, "not a directory", "point it at a run's rollout_data/ directory")
        return
    num_rollout = rollouts_for_epochs(cfg)
    if num_rollout is not None:
        missing = [i for i in range(num_rollout) if not (Path(source) / f"{i}.jsonl").exists()]
        if missing:
            yield Problem(
                key,
                source,
                f"no dump for rollout(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} of train.num_rollout={num_rollout}",
                "lower train.num_rollout to the number of dumps",
            )
    if cfg.eval.interval:
        yield Problem("eval.interval", cfg.eval.interval, f"{key} starts no engines to evaluate with", "set eval=none")
