"""resolve(cfg): validation and derive run once; the config comes back read-only beside the RunPlan that the
driver executes and the dry run prints."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys

import pytest

from slime.config.problems import ConfigError
from slime.driver.rollout_setup import rollout_setup
from slime.engine.groups import engine_specs
from slime.plan.derive import derive
from slime.plan.resolve import resolve
from tests.helpers.compose import typed_config

GPU_RECIPE = [  # no data, no checkpoint on this machine; 4 trainer GPUs (tp 2) and two 2-GPU engines
    "recipe=gpu/qwen3_4b_grpo_disagg",
    "cluster.actor.num_gpus_per_node=4",
    "cluster.rollout.num_gpus=4",
    "cluster.rollout.num_gpus_per_engine=2",
    "parallelism.tp=2",
    "debug.gpu_memory_gib=80",
]


def count_calls(monkeypatch, function) -> list[int]:
    """Wrap `function` wherever a loaded module holds it by its name; the list grows by one per call."""
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)

    # slime's modules only: the callers live there, and a lazy library module (transformers) imports on getattr
    for name, module in list(sys.modules.items()):
        if name.startswith("slime.") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counted)
    return calls


@pytest.mark.parametrize("function", [derive, engine_specs])
def test_derive_and_the_engine_specs_run_once_per_resolve(monkeypatch, function):
    cfg, gpu = typed_config([]), typed_config(GPU_RECIPE)
    calls = count_calls(monkeypatch, function)
    _, plan = resolve(cfg)
    rollout_setup(cfg, plan)  # what the driver hands the rollout manager reads the plan's specs
    assert len(calls) == 1
    calls.clear()
    resolve(gpu, defer_absent=True)  # the dry run's resolve too
    assert len(calls) == 1


def test_the_resolved_config_refuses_assignment_and_the_input_stays_as_it_was():
    given = typed_config([])
    cfg, _ = resolve(given)
    with pytest.raises(dataclasses.FrozenInstanceError, match="RolloutConfig.batch_size: the resolved config"):
        cfg.rollout.batch_size = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train = given.train
    with pytest.raises(dataclasses.FrozenInstanceError):
        del cfg.seed
    for dataset in cfg.eval.datasets.values():  # dataclasses inside containers too
        with pytest.raises(dataclasses.FrozenInstanceError):
            dataset.top_p = 0.5
    assert cfg.train.global_batch_size == 128 and cfg.checkpoint.save is not None  # derived defaults filled
    given.rollout.batch_size = 7  # the caller's object was copied, not frozen
    assert cfg.rollout.batch_size == 32


def test_the_resolved_config_stays_read_only_through_pickle_copy_and_replace():
    cfg, _ = resolve(typed_config([]))
    plain, _ = resolve(typed_config([]))
    for copied in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), dataclasses.replace(cfg, seed=cfg.seed)):
        assert copied == plain and isinstance(copied, type(typed_config([])))
        with pytest.raises(dataclasses.FrozenInstanceError):
            copied.rollout.temperature = 2.0
    changed = dataclasses.replace(cfg.train, lr=0.5)  # how the critic's setup changes its copy
    assert changed.lr == 0.5 and cfg.train.lr != 0.5


def test_the_plan_of_a_gpu_recipe():
    _, plan = resolve(typed_config(GPU_RECIPE), defer_absent=True)
    d = plan.derived
    assert (d.actor_gpus, d.rollout_gpus, d.total_gpus) == (4, 4, 8)
    assert [spec.num_gpus for spec in plan.engines] == [2, 2]
    assert plan.roles.actor == (0, 1, 2, 3) and plan.roles.engines == ((4, 5), (6, 7)) and plan.roles.critic == ()
    assert (plan.layout.dp, plan.layout.tp) == (2, 2)
    assert plan.table()[3:5] == [("total_gpus", "8"), ("num_engines", "2")]  # printed at start-up
    assert plan.memory is not None and plan.memory.engine["weights"] > 0
    assert sorted(p.key for p in plan.still_needs) == ["cluster.device", "data.prompt_data", "model.hf_checkpoint"]


def test_a_launch_refuses_what_a_dry_run_defers_and_both_refuse_config_mistakes():
    with pytest.raises(ConfigError) as launch:
        resolve(typed_config(GPU_RECIPE))
    assert {p.key for p in launch.value.problems} == {"cluster.device", "data.prompt_data", "model.hf_checkpoint"}
    with pytest.raises(ConfigError) as mistake:
        resolve(typed_config([*GPU_RECIPE, "parallelism.tp=3"]), defer_absent=True)
    assert "parallelism.tp" in {p.key for p in mistake.value.problems}
    assert all(not p.machine for p in mistake.value.problems)
