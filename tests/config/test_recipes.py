"""Every recipe under recipes/ (found recursively): its header, its count, and that it composes and validates.

Top-level recipes (CPU ones and qwen3_4b_grpo) are composed and validated by test_config's every-option
test, which lists exactly them; recipes/gpu/ ones are composed and validated here on CPU as a remote
launch would be (cluster.ray_address=auto, an HF directory holding the model's config.json, a prompt file),
so nothing about this machine (its GPUs, its files) is checked, and their GPU count must match the header.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from slime.plan.derive import derive
from slime.plan.memory import GIB, estimate_memory
from slime.plan.validate import collect_problems
from tests.helpers.compose import CONF, ROOT, fake_hf_dir, group_options, typed_config

RECIPES = ROOT / "recipes"
ALL = sorted(RECIPES.rglob("*.yaml"))
TOP = [p for p in ALL if p.parent == RECIPES]
GPU = sorted((RECIPES / "gpu").glob("*.yaml"))
FAMILIES = {"grpo", "gspo", "cispo", "dapo", "rloo", "reinforce_plus_plus", "ppo", "sft"}


def recipe_name(path: Path) -> str:
    return path.relative_to(RECIPES).with_suffix("").as_posix()


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


def selected_options(path: Path) -> dict[str, str]:
    """group -> option of the recipe's `override /group: option` defaults (`group@package` keys: the group)."""
    defaults = yaml.safe_load(path.read_text()).get("defaults", [])
    return {key.split("/", 1)[1]: value for entry in defaults for key, value in entry.items()}


def test_recipes_are_found_recursively_and_counted():
    assert (len(ALL), len(TOP), len(GPU)) == (35, 19, 16), [recipe_name(p) for p in ALL]
    assert set(ALL) == set(TOP) | set(GPU)
    # test_config validates every top-level recipe: its option list is exactly these.
    assert sorted(o for g, o in group_options() if g == "recipe") == sorted(p.stem for p in TOP)
    tiny = {p.stem.removeprefix("tiny_") for p in TOP if p.stem.startswith("tiny_")}
    assert tiny == FAMILIES | {"optuna", "tool_use", "off_policy", "opd", "routing_replay"}


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


def prompt_file(tmp_path: Path, num_prompts: int = 256) -> str:
    """Records carrying both the RL keys (prompt, label) and the SFT key (messages); an epoch of them
    fills a rollout step of every recipe (128 prompts at most)."""
    path = tmp_path / "train.jsonl"
    lines = []
    for i in range(num_prompts):
        chat = [{"role": "user", "content": f"What is {i} + 1?"}]
        answer = str(i + 1)
        record = {"prompt": chat, "label": answer, "messages": [*chat, {"role": "assistant", "content": answer}]}
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))
    return str(path)


@pytest.mark.parametrize("path", GPU, ids=recipe_name)
def test_gpu_recipe_composes_and_validates_on_cpu(path, tmp_path):
    options = selected_options(path)
    groups = {g: (g.split("@")[0], o) for g, o in options.items()}
    missing = [f"conf/{g}/{o}.yaml" for g, o in groups.values() if not (CONF / g / f"{o}.yaml").exists()]
    assert not missing, f"{recipe_name(path)} selects option file(s) that do not exist: {', '.join(missing)}"
    overrides = [
        f"recipe={recipe_name(path)}",
        f"model.hf_checkpoint={fake_hf_dir(tmp_path, options['model'])}",
        f"data.prompt_data={prompt_file(tmp_path)}",
        "cluster.ray_address=auto",  # validated for a remote cluster, not this machine's GPUs
    ]
    if "model@teacher" in options:  # the distillation teacher's own checkpoint
        (tmp_path / "teacher").mkdir()
        overrides.append(f"teacher.hf_checkpoint={fake_hf_dir(tmp_path / 'teacher', options['model@teacher'])}")
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
