"""main.py's front door: the command line checked, and a single run's config composed and validated, before
`@hydra.main` starts its job.

Hydra's job (hydra/core/utils.py, `run_job`) creates the run directory and writes `.hydra/` into it before any
code of ours runs; everything a configuration error or a dry run needs happens here first, so neither leaves a
directory behind:

- every override (`--multirun`, `--cfg`, `--help` included): an unknown key, with or without `+`, or an
  unknown option of a group exits 2 naming the nearest names (slime.config.cli_overrides);
- a single run: the config is composed as Hydra's job will compose it, typed and validated; a problem exits 2
  (every problem listed), `debug=dry_run` prints its plan here and exits (0, or 2). Only a valid run reaches
  Hydra, which makes its run directory and `.hydra/` records as before.

A sweep's jobs are validated each in its job (slime.driver.launch); their directories are the sweep's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override
from hydra.core.utils import env_override
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from slime.config import ConfigError, store_run_schema, to_run_config
from slime.config.cli_overrides import (
    OverrideProblem,
    analysis_overrides,
    group_problems,
    key_problems,
    parse,
    searched_repository,
    searchpath_lines,
    split_groups,
)
from slime.plan.dry_run import dry_run
from slime.plan.resolve import resolve
from slime.run_schema import outside_specs, register_configs, seam_keys

EXIT_CONFIG_ERROR = 2
# Flags that change where the config comes from or that compose nothing of ours: left to Hydra as given.
_HYDRA_ONLY = ("shell_completion", "hydra_help", "experimental_rerun", "config_path", "config_name", "config_dir")


def check_command_line(argv: list[str], *, config_dir: Path, config_name: str, job_name: str) -> None:
    """Return when Hydra may take the command line `argv` (sys.argv[1:]); exit 2 after printing each problem
    of a configuration error; a single run's `debug=dry_run` exits with the dry run's status."""
    args = get_args_parser().parse_args(argv)  # Hydra's own flags (argparse exits 2 on a bad one, as Hydra)
    if any(getattr(args, flag) for flag in _HYDRA_ONLY):
        return
    try:
        overrides = parse(args.overrides)
    except HydraException as exc:  # OverrideParseException: bad syntax, Hydra's message says where
        _refuse([str(exc)])
    with initialize_config_dir(config_dir=str(config_dir), job_name=job_name, version_base="1.3"):
        _register_schema(overrides, config_name)
        tree, keys = _checked_overrides(overrides, config_name)
        mode = next((o.value() for o in overrides if o.key_or_group == "hydra.mode"), tree.hydra.mode)
        multirun = args.multirun or mode in (RunMode.MULTIRUN, RunMode.MULTIRUN.name)  # flag, override or config
        if multirun or args.help or args.cfg or args.info:  # nothing to start: Hydra prints, or a sweep's
            if keys:  # jobs validate each
                _refuse(keys)
            return
        _validate_run(config_name, args.overrides, problems=keys)


def _register_schema(overrides: list[Override], config_name: str) -> None:
    """Register the run schema the defaults list names, with the options of each part outside the project that the
    config chooses (`rollout.engine=my_engines.fast`, on the command line or in an option's YAML): their keys are
    read from the config composed without a schema, which takes the options' values as they are."""
    repo = searched_repository(GlobalHydra.instance().config_loader(), config_name, overrides)
    groups, keys = split_groups(overrides, repo)
    seams = [o.input_line for o in keys if not o.is_sweep_override() and o.get_key_element() in seam_keys()]
    store_run_schema(OmegaConf.create({}))
    try:
        tree = compose(config_name, overrides=[*searchpath_lines(keys), *analysis_overrides(groups), *seams])
    except (HydraException, OmegaConfBaseException):  # the composition with the schema says why
        tree = OmegaConf.create({})
    try:
        register_configs(outside_specs(tree))
    except ValueError as exc:  # a part's options clash with another's keys
        register_configs()
        _refuse([str(exc)])


def _checked_overrides(overrides: list[Override], config_name: str) -> tuple[DictConfig, list[OverrideProblem]]:
    """(the config composed from the command line's group choices, with its hydra node; each key problem)."""
    repo = searched_repository(GlobalHydra.instance().config_loader(), config_name, overrides)
    groups, keys = split_groups(overrides, repo)
    problems = group_problems(groups, keys, repo)
    bad = {p.line for p in problems}  # left out of the composition, which they would stop
    groups, keys = [o for o in groups if o.input_line not in bad], [o for o in keys if o.input_line not in bad]
    try:
        lines = [*searchpath_lines(keys), *analysis_overrides(groups)]
        tree = compose(config_name, overrides=lines, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        _refuse([*problems, _hydra_message(exc)])
    problems += key_problems(keys, tree)
    if bad:  # nothing composes with an unknown option or group: stop here, every override named
        _refuse(problems)
    return tree, problems


def _validate_run(config_name: str, lines: list[str], *, problems: list[OverrideProblem]) -> None:
    """Compose the run as Hydra's job will, then type and validate it (slime.driver.launch.execute does the
    same inside the job); with key `problems`, the rest of the command line is validated too, and every
    problem is listed."""
    bad = {p.line for p in problems}
    try:
        cfg = compose(config_name, overrides=[line for line in lines if line not in bad], return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        _refuse([*problems, _hydra_message(exc)])
    task_cfg = _as_job(cfg)
    try:
        with env_override(dict(cfg.hydra.job.env_set)):
            run_cfg = to_run_config(task_cfg)
            if run_cfg.debug.dry_run and not problems:
                sys.exit(dry_run(run_cfg))
            resolve(run_cfg)
    except (ConfigError, OmegaConfBaseException) as exc:
        _refuse([*problems, str(exc)])
    if problems:
        _refuse(problems)


def _as_job(cfg: DictConfig) -> DictConfig:
    """The task config of `cfg` with `${hydra:runtime.output_dir}` resolving as in Hydra's job (hydra.run.dir,
    absolute): hydra.core.utils.run_job."""
    HydraConfig.instance().set_config(cfg)
    output_dir = os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = output_dir
    HydraConfig.instance().set_config(cfg)
    task_cfg = cfg.copy()
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def _hydra_message(exc: Exception) -> str:
    """Hydra's message with the omegaconf error under it (which names the key and the expected type)."""
    cause = exc.__cause__
    return f"{exc}\n{cause}" if cause is not None and str(cause) not in str(exc) else str(exc)


def _refuse(problems: list[str | OverrideProblem]) -> None:
    for problem in problems:
        print(f"Configuration error: {problem}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)
