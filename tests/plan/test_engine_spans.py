"""Engines wider than a node (slime.plan.check_spans): the plan's node slices per engine, SGLang's multi-node flags in
the dry run (vLLM's too), and what validation says where an engine cannot span nodes."""

from __future__ import annotations

import pytest

from slime.config.problems import ConfigError
from slime.plan.resolve import resolve
from slime.plan.roles import node_slices
from tests.helpers.compose import fake_hf_dir, typed_config
from tests.helpers.runs import run_main

KEY = "cluster.rollout.num_gpus_per_engine"
TWO_NODES = ["model=qwen3_4b", "cluster=two_nodes_16gpu", "data=digit_task", "rollout.rm_type=exact_match"]


def test_node_slices_of_an_engine_follow_the_packed_bundles():
    assert node_slices((0, 1, 2, 3), 8) == {0: (0, 1, 2, 3)}
    assert node_slices(tuple(range(8, 24)), 8) == {1: tuple(range(8)), 2: tuple(range(8))}
    assert node_slices((6, 7, 8, 9), 8) == {0: (6, 7), 1: (0, 1)}


def test_the_16_gpu_recipe_plans_one_sglang_server_per_node_without_starting_ray():
    proc, imported = run_main("recipe=gpu/qwen3_30b_a3b_grpo_2x8_tp16", "debug=dry_run")
    assert proc.returncode == 0 and "ray" not in imported, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[4].startswith("Placement plan (16 GPU(s) of 2 node(s) x 8; colocated;")
    assert "  node 0 GPU 0: actor rank 0 (dp 0, tp 0, pp 0, cp 0) + engine 0 [GPU 1/16]" in lines
    assert "  node 1 GPU 7: actor rank 15 (dp 3, tp 3, pp 0, cp 0) + engine 0 [GPU 16/16]" in lines
    assert (
        "  engine 0 spans 2 nodes, one server each: --nnodes 2; --node-rank 0 on node 0 (serves HTTP; "
        "--dist-init-addr on a reserved port there), --node-rank 1 on node 1"
    ) in lines
    assert "1 engine(s) x 16 GPU(s)" in proc.stdout
    assert "cluster.rollout.num_gpus_per_engine" not in proc.stdout.split("Still needed by a real launch")[1]
    assert lines[-1] == "Dry run: configuration valid; nothing was started."


def span_problems(overrides: list[str], tmp_path) -> list:
    """The problems `resolve` raises, as a launch does, for the config of `overrides` (GPUs declared on a Ray
    cluster's nodes, the model's checkpoint present)."""
    model = f"model.hf_checkpoint={fake_hf_dir(tmp_path, 'qwen3_4b')}"
    with pytest.raises(ConfigError) as info:
        resolve(typed_config([*TWO_NODES, model, "cluster.ray_address=auto", *overrides]))
    return info.value.problems


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_spanning_engine_is_launched_with_nothing_more_needed(engine, tmp_path):
    overrides = [
        f"rollout={engine}",
        "cluster.colocate=true",
        "cluster.actor.num_nodes=2",
        "rollout.weight_sync.mode=tensor",
    ]
    model = f"model.hf_checkpoint={fake_hf_dir(tmp_path, 'qwen3_4b')}"
    _, plan = resolve(typed_config([*TWO_NODES, model, "cluster.ray_address=auto", *overrides, f"{KEY}=16"]))
    assert plan.roles.engines == (tuple(range(16)),) and plan.still_needs == ()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (  # four training GPUs, then engines of 6: engine 0 has 4 GPUs on node 0 and 2 on node 1
            ["rollout=sglang", "cluster.rollout.num_gpus=12", "cluster.rollout.num_gpus_per_engine=6"],
            "engine 0's GPUs lie on nodes 0-1 (8 GPUs a node) in unequal slices",
        ),
    ],
)
def test_an_engine_that_cannot_span_nodes_is_a_config_error(overrides, expected, tmp_path):
    problems = span_problems(["cluster.actor.num_gpus_per_node=4", *overrides], tmp_path)
    (problem,) = [p for p in problems if p.key == KEY]
    assert not problem.machine and expected in str(problem)


def test_the_dry_run_names_vllms_multi_node_flags():
    proc, _ = run_main(
        "recipe=gpu/qwen3_30b_a3b_grpo_ep_vllm", "cluster.rollout.num_gpus_per_engine=16", "debug=dry_run"
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        "  engine 0 spans 2 nodes, one server each: --nnodes 2; --node-rank 0 on node 0 (serves HTTP; "
        "--master-addr/--master-port on a reserved port there), --node-rank 1 on node 1"
    ) in proc.stdout.splitlines()
