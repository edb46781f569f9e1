"""The algo options (conf/algo/*.yaml) and where each one's first-step check runs: every option whose estimator
trains no critic on one fsdp rank driven directly (tests/algo/test_algo_first_step.py); these also through
`python main.py` (tests/e2e/test_algorithms.py), because their runs differ beyond the estimator record: grpo's TIS
against the engine, dapo's dynamic filter, ppo's critic, sft's chat data."""

from __future__ import annotations

import yaml

from slime.algo.estimators import ESTIMATORS
from tests.helpers.compose import CONF

ESTIMATOR_OF = {p.stem: yaml.safe_load(p.read_text())["advantage_estimator"] for p in (CONF / "algo").glob("*.yaml")}
ALGO_OPTIONS = sorted(ESTIMATOR_OF)
END_TO_END = ("dapo", "grpo", "ppo", "sft")
IN_PROCESS = tuple(algo for algo in ALGO_OPTIONS if not ESTIMATORS.get(ESTIMATOR_OF[algo]).needs_critic)
