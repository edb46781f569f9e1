"""Every recipe under recipes/ (found recursively): its header, its count, and that it composes and validates.

Top-level recipes (CPU ones and qwen3_4b_grpo) are composed and validated by test_config's every-option
test, which lists exactly them; recipes/gpu/ ones are composed and validated here on CPU as a remote
launch would be (cluster.ray_address=auto, an HF directory holding the model's config.json, a prompt file),
so nothing about this machine (its GPUs, its files) is checked, and their GPU count must match the header.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slime.plan.derive import derive
from slime.plan.memory import GIB, estimate_memory
from slime.plan.validate import collect_problems
from tests.helpers.compose import CONF, compose_config, group_choices, group_options, typed_config
from tests.helpers.recipes import (
    ALL,
    GPU,
    RECIPES,
    flat,
    recipe_name,
    recipe_overrides,
    selected_options,
    set_values,
)

TOP = [p for p in ALL if p.parent == RECIPES]
FAMILIES = {"grpo", "gspo", "cispo", "dapo", "rloo", "reinforce_plus_plus", "ppo", "sft"}


def header(path: Path) -> dict[str, str]:
    """`# Key: value` lines of the leading comment block (continuation lines dropped)."""
    fields = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        match = re.match(r"# (Purpose|GPUs|Launch): (.*)", line)
        if match:
            fields[match[1]] = match[2]
    return fields


def test_recipes_are_found_recursively_and_counted():
    assert (len(ALL), len(TOP), len(GPU)) == (39, 22, 17), [recipe_name(p) for p in ALL]
    assert set(ALL) == set(TOP) | set(GPU)
    # test_config validates every top-level recipe: its option list is exactly these.
    assert sorted(o for g, o in group_options() if g == "recipe") == sorted(p.stem for p in TOP)
    tiny = {p.stem.removeprefix("tiny_") for p in TOP if p.stem.startswith("tiny_")}
    assert tiny == FAMILIES | {"optuna", "tool_use", "agent", "off_policy", "opd", "routing_replay", "vlm"}


@pytest.mark.parametrize("path", ALL, ids=recipe_name)
def test_recipe_header_says_purpose_gpus_and_launch_command(path):
    text = path.read_text()
    assert text.startswith("# @package _global_\n")
    fields = header(path)
    assert set(fields) == {"Purpose", "GPUs", "Launch"}, fields
    assert re.match(r"\d+( |$)", fields["GPUs"]), fields["GPUs"]
    assert fields["Launch"].startswith("python main.py") and f"recipe={recipe_name(path)}" in fields["Launch"]
    assert len(text.splitlines()) <= 60


def test_each_tiny_recipe_is_its_family_on_cpu():
    for family in FAMILIES:
        cfg = typed_config([f"recipe=tiny_{family}"])
        assert (cfg.algo.name, cfg.cluster.device, cfg.model.name) == (family, "cpu", "tiny_qwen3")
    assert typed_config(["recipe=tiny_ppo"]).algo.num_critic_only_steps == 1


@pytest.mark.parametrize("path", GPU, ids=recipe_name)
def test_gpu_recipe_composes_and_validates_on_cpu(path, tmp_path):
    overrides = recipe_overrides(path, tmp_path)
    cfg = typed_config(overrides)
    problems = [str(p) for p in collect_problems(cfg) if not getattr(p, "machine", False)]
    assert problems == []
    assert cfg.cluster.device == "cuda"
    derived = derive(cfg)
    assert derived.total_gpus == int(header(path)["GPUs"].split()[0])
    # the layout fits the 80 GB cards the headers name, by the dry run's estimate (slime/plan/memory.py)
    estimate = estimate_memory(
        dataclasses.replace(cfg, debug=dataclasses.replace(cfg.debug, gpu_memory_gib=80.0)), derived
    )
    assert estimate.warnings() == [] and estimate.peak <= 80 * GIB, estimate.warnings()


# A recipe selects group options (`override /group: option`) and sets values only where no option fits: the run's
# sizes, as a preset sets them (conf/preset/sizes/), and keys no option of the group sets. Sizes also counted:
# the other micro-batch size, the critic's warm-up and DAPO's overlong window (a span of the response length).
SIZES = {
    f"{group}.{key}"
    for sizes in (CONF / "preset" / "sizes").glob("*.yaml")
    for group, values in set_values(sizes).items()
    for key in flat(values)
} | {"parallelism.micro_batch_size", "algo.num_critic_only_steps", "algo.overlong_buffer_len"}
# The groups a command line chooses instead of a recipe: those of more than one option (train, checkpoint and paths
# have one; a recipe sets their values as it sets sizes).
CHOSEN_GROUPS = sorted(
    {g for g, _ in group_options() if [h for h, _ in group_options()].count(g) > 1} - {"recipe", "preset"}
    | {"model@teacher"}
)


def group_node(group: str) -> str:
    """The config node a group's options fill (model@teacher fills `teacher`)."""
    return group.split("@")[1] if "@" in group else group


def option_keys(group: str) -> set[str]:
    """Every key (flattened) that an option of `group` sets itself."""
    folder = CONF / group.split("@")[0]
    return {key for option in folder.glob("*.yaml") for key in flat(set_values(option))}


def recipe_groups(path: Path) -> list[str]:
    """The groups (of more than one option) whose option the recipe selects or under whose node it sets values."""
    touched = set(selected_options(path)) | {g for g in CHOSEN_GROUPS if group_node(g) in set_values(path)}
    return sorted(g for g in touched if g in CHOSEN_GROUPS)


@pytest.mark.parametrize("path", ALL, ids=recipe_name)
def test_recipe_sets_values_only_where_no_option_fits(path):
    values = set_values(path)
    for group in recipe_groups(path):
        owned = option_keys(group)
        node = group_node(group)
        for key in flat(values.get(node, {})):
            if f"{node}.{key}" in SIZES:
                continue
            assert key not in owned and not any(key.startswith(f"{o}.") for o in owned), (
                f"{recipe_name(path)} sets {node}.{key}, which an option of {group} sets: choose or add that option"
            )


@functools.cache
def composed(overrides: tuple[str, ...]) -> dict:
    """The config composed with `overrides`, as nested dicts (interpolations as written)."""
    return OmegaConf.to_container(compose_config(list(overrides)), resolve=False)


def composed_node(overrides: tuple[str, ...], node: str) -> dict:
    """The node `node` of the config composed with `overrides`, flattened."""
    return flat(composed(overrides)[node] or {})


@functools.cache
def recipe_choices(name: str) -> dict[str, str | None]:
    return group_choices([f"recipe={name}"])


def without(tree: dict, keys: set[str]) -> dict:
    """`tree` without `keys`, what lies under them and the nodes that hold them."""
    return {
        k: v
        for k, v in tree.items()
        if not any(k == o or f"{k}.".startswith(f"{o}.") or o.startswith(f"{k}.") for o in keys)
    }


@pytest.mark.parametrize(
    "path,group",
    [(path, group) for path in ALL for group in recipe_groups(path)],
    ids=lambda x: recipe_name(x) if isinstance(x, Path) else x,
)
def test_a_group_chosen_on_the_command_line_wins_over_the_recipe(path, group):
    """recipe=X group=OTHER, for every group of more than one option that the recipe chooses or sets values in (OTHER:
    its first option that the recipe does not choose; test_recipe_sets_values_only_where_no_option_fits holds for
    them all): the group's node is the one the same run composes without the recipe (the recipe's other choices,
    the model's preset), but for the sizes the recipe sets."""
    selected = selected_options(path)
    node = group_node(group)
    set_here = set(flat(set_values(path).get(node, {})))
    chosen = recipe_choices(recipe_name(path))[group]
    other = next(o for g, o in group_options() if g == group.split("@")[0] and o != chosen)
    with_recipe = composed_node((f"recipe={recipe_name(path)}", f"{group}={other}"), node)
    alone = composed_node((*(f"{g}={o}" for g, o in selected.items() if g != group), f"{group}={other}"), node)
    assert with_recipe != composed_node((f"recipe={recipe_name(path)}",), node)  # the choice changed something
    assert without(with_recipe, set_here) == without(alone, set_here), other


def test_eval_none_turns_off_the_arithmetic_recipes_eval():
    assert typed_config(["recipe=smollm2_arithmetic"]).eval.interval == 5
    cfg = typed_config(["recipe=smollm2_arithmetic", "eval=none"])
    assert (cfg.eval.interval, cfg.eval.datasets) == (None, {})
    assert (cfg.rollout.max_response_len, cfg.data.generator["_target_"]) == (
        96,
        "slime.assets.arithmetic_task.write_dataset",
    )


def test_the_sglang_math_recipe_with_vllm_chosen_is_the_vllm_math_recipe():
    """The engine of recipes/gpu/qwen3_4b_grpo_math is one command-line choice away from its vLLM twin."""
    chosen = composed(("recipe=gpu/qwen3_4b_grpo_math", "rollout=vllm_colocated"))
    assert chosen == composed(("recipe=gpu/qwen3_4b_grpo_math_vllm",))
    assert composed(("recipe=gpu/qwen3_4b_grpo_math",)) != chosen
