"""The algo options (conf/algo/*.yaml) and where each one's first-step check runs: every option but ppo (its critic)
on one fsdp rank driven directly (tests/algo/test_algo_first_step.py); these also through `python main.py`
(tests/e2e/test_algorithms.py), because their runs differ beyond the estimator record: grpo's TIS against the
engine, dapo's dynamic filter, ppo's critic, sft's chat data."""

from __future__ import annotations

from tests.helpers.compose import CONF

ALGO_OPTIONS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
END_TO_END = ("dapo", "grpo", "ppo", "sft")
IN_PROCESS = tuple(algo for algo in ALGO_OPTIONS if algo != "ppo")
