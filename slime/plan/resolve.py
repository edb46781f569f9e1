"""resolve(cfg): validate once, derive once, fill the derived defaults, freeze; return the config and its plan.

    cfg, plan = resolve(to_run_config(dcfg))          # a launch: any problem raises ConfigError
    cfg, plan = resolve(cfg, defer_absent=True)       # the dry run: absent inputs go to plan.still_needs

An absent input is a `Problem` marked `machine`: a path that does not exist here, GPUs this machine lacks,
prompt data or a reward not given yet. A dry run plans the launch elsewhere, where those exist, and
lists them as what the launch still needs; every other problem (unknown keys, bad values, impossible
layouts) raises in both modes.
"""

from __future__ import annotations

import copy
import dataclasses

from slime.config.derived import fill_derived
from slime.config.problems import ConfigError, Problem
from slime.config.schema import RunConfig
from slime.plan.check_spans import check_engine_spans
from slime.plan.derive import derive
from slime.plan.frozen import freeze
from slime.plan.run_plan import RunPlan, plan_run
from slime.plan.validate import problems_of


def resolve(cfg: RunConfig, *, defer_absent: bool = False) -> tuple[RunConfig, RunPlan]:
    """(a read-only copy of `cfg` with its derived defaults filled in, its RunPlan); `cfg` is left as it was.
    Raises ConfigError listing every problem (with `defer_absent`, every problem but absent inputs)."""
    derived = derive(cfg)
    problems = problems_of(cfg, derived)
    _refuse(problems, defer_absent)
    resolved = fill_derived(copy.deepcopy(cfg), derived)
    plan = plan_run(resolved, derived)
    problems += check_engine_spans(resolved, plan)  # read off the plan, which needs a valid config
    _refuse(problems, defer_absent)
    return freeze(resolved), dataclasses.replace(plan, still_needs=tuple(p for p in problems if p.machine))


def _refuse(problems: list[Problem], defer_absent: bool) -> None:
    refused = [p for p in problems if not (defer_absent and p.machine)]
    if refused:
        raise ConfigError(refused)
