"""Configs fit the choice: each model option brings its preset; `python main.py` alone is the embedded run.

CLI tests run main.py as a user does. A configuration error must stop the run in validation: exit 2, one
message naming every key with its fix, nothing written where the config points, and Ray never imported.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONF, ROOT, compose_config, session_processes, typed_config


def run_main(*args: str, cwd: Path = ROOT, env: dict | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """main.py under `-X importtime`: (the finished process, the top-level packages it imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "main.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", proc.stderr, flags=re.M))
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, {name.split(".")[0] for name in imported}


def assert_stopped_in_validation(proc: subprocess.CompletedProcess, imported: set[str]) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("Configuration error: invalid configuration") == 1, proc.stderr
    assert "ray" not in imported and "sglang" not in imported
    assert session_processes() == []


EMBEDDED = {
    "rollout.batch_size": 32,
    "rollout.n_samples_per_prompt": 8,
    "rollout.max_response_len": 2,
    "rollout.temperature": 1.0,
    "rollout.rm_type": "first_word",
    "rollout.deterministic": True,
    "train.num_rollout": 60,
    "train.global_batch_size": 128,
    "train.num_steps_per_rollout": 2,
    "train.lr": 1e-3,
    "train.adam_beta2": 0.98,
    "algo.use_kl_loss": False,
    "algo.kl_loss_coef": 0.0,
    "model.name": "tiny_qwen3",
    "cluster.device": "cpu",
    "parallelism.micro_batch_size": 64,
    "seed": 1234,
}
PRODUCTION = {
    "rollout.batch_size": 32,
    "rollout.n_samples_per_prompt": 8,
    "rollout.max_response_len": 8192,
    "rollout.temperature": 1.0,
    "rollout.rm_type": None,
    "rollout.deterministic": False,
    "train.num_rollout": 3000,
    "train.global_batch_size": 256,
    "train.num_steps_per_rollout": 1,
    "train.lr": 1e-6,
    "algo.use_kl_loss": True,
    "algo.kl_loss_coef": 0.001,
    "algo.kl_loss_type": "low_var_kl",
    "cluster.device": "cuda",
    "cluster.num_gpus_per_node": 8,
    "cluster.actor.num_gpus_per_node": 4,
    "cluster.rollout.num_gpus": 4,
    "data.prompt_data": None,
    "data.input_key": "prompt",
    "data.label_key": "label",
    "data.apply_chat_template": True,
    "data.generator": None,
    "parallelism.max_tokens_per_gpu": 16384,
    "parallelism.gradient_checkpointing": True,
}


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_embedded_run_is_the_default():
    printed = yaml.safe_load(
        subprocess.run(
            [sys.executable, "main.py", "--cfg", "job"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )
    assert {key: lookup(printed, key) for key in EMBEDDED} == EMBEDDED
    assert printed["data"]["generator"]["_target_"] == "slime.assets.digit_task.write_dataset"
    assert printed["checkpoint"]["ref_load"] == "${model.hf_checkpoint}"


@pytest.mark.parametrize("model,name", [("qwen3_4b", "Qwen3-4B"), ("qwen3_1p7b", "Qwen3-1.7B")])
def test_production_model_composes_its_own_run(model, name):
    proc = subprocess.run(
        [sys.executable, "main.py", f"model={model}", "algo=grpo", "--cfg", "job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert {key: lookup(printed, key) for key in PRODUCTION} == PRODUCTION
    assert printed["model"]["hf_checkpoint"].endswith(f"/checkpoints/{name}")
    assert printed["checkpoint"]["ref_load"] == "${model.hf_checkpoint}"


def test_every_model_option_selects_a_preset():
    """Each model option selects one preset (an alias option names the option it stands for); every preset is used."""
    options = {p.stem for p in (CONF / "model").glob("*.yaml")}
    presets = {p.stem for p in (CONF / "preset").glob("*.yaml")}
    selected = {}
    for option in (CONF / "model").glob("*.yaml"):
        defaults = yaml.safe_load(option.read_text())["defaults"]
        if isinstance(defaults[0], str) and defaults[0] in options:  # an alias: [<model option>, _self_]
            assert defaults == [defaults[0], "_self_"], option
            continue
        assert len(defaults) == 1 and list(defaults[0]) == ["/preset@_global_"], option
        selected[option.stem] = defaults[0]["/preset@_global_"]
    assert set(selected.values()) == presets


def test_root_config_holds_no_group_values():
    root = yaml.safe_load((CONF / "config.yaml").read_text())
    assert set(root) == {"defaults", "seed", "hydra"}
    groups = [next(iter(d)) for d in root["defaults"] if isinstance(d, dict)]
    assert groups[-2:] == ["model", "recipe"]  # a preset may override every group listed before the model


def test_command_line_beats_the_preset():
    cfg = typed_config(["model=qwen3_4b", "cluster=local_cpu", "data=digit_task", "rollout.max_response_len=16"])
    assert (cfg.cluster.device, cfg.rollout.max_response_len, cfg.train.num_rollout) == ("cpu", 16, 3000)
    assert cfg.data.prompt_data == cfg.data.generator["path"]


def test_recipe_overlays_the_preset():
    cfg = typed_config(["recipe=qwen3_4b_grpo"])
    assert (cfg.model.name, cfg.rollout.rm_type, cfg.algo.eps_clip_high, cfg.parallelism.max_tokens_per_gpu) == (
        "qwen3_4b",
        "exact_match",
        0.28,
        9216,
    )
    assert (cfg.train.global_batch_size, cfg.rollout.deterministic, cfg.algo.kl_loss_coef) == (256, False, 0.001)


def test_grpo_carries_the_seeds_kl_loss_and_the_embedded_preset_turns_it_off():
    grpo = yaml.safe_load((CONF / "algo" / "grpo.yaml").read_text())
    assert (grpo["use_kl_loss"], grpo["kl_loss_coef"], grpo["kl_loss_type"]) == (True, 0.001, "low_var_kl")
    assert typed_config(["algo=dapo"]).algo.use_kl_loss is False


def test_production_model_on_this_machine_names_every_missing_piece(tmp_path):
    """The acceptance case: one message, each key with the override that fixes it; nothing started."""
    proc, imported = run_main("model=qwen3_4b", "algo=grpo", f"hydra.run.dir={tmp_path / 'run'}")
    assert_stopped_in_validation(proc, imported)
    lines = {line.split("=", 1)[0].strip("- "): line for line in proc.stderr.splitlines() if line.startswith("  - ")}
    assert "set model.hf_checkpoint=<dir>" in lines["model.hf_checkpoint"]
    assert "set data.prompt_data=<file.jsonl>" in lines["data.prompt_data"]
    assert "needs 8 GPU(s)" in lines["cluster.device"] and "0 CUDA device(s)" in lines["cluster.device"]
    assert "cluster.ray_address=" in lines["cluster.device"] and "cluster=local_cpu" in lines["cluster.device"]
    assert (
        "rollout.rm_type=<one of dapo, deepscaler, exact_match, f1, first_word, gpqa, last_number, math, remote_rm>"
        in lines["rollout.rm_type"]
    )
    assert "checkpoint.ref_load" not in lines  # the same directory as model.hf_checkpoint: reported once
    assert not (tmp_path / "run" / "result.json").exists()


def test_prompt_data_typo_is_not_created(tmp_path):
    typo = tmp_path / "data" / "typo.jsonl"
    proc, imported = run_main(f"data.prompt_data={typo}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_stopped_in_validation(proc, imported)
    assert f"data.prompt_data='{typo}': path does not exist" in proc.stderr
    assert not typo.parent.exists()


def test_eval_prompt_data_typo_is_not_created(tmp_path):
    typo = tmp_path / "eval" / "typo.jsonl"
    key = "eval.datasets.digit_task.prompt_data"
    proc, imported = run_main("recipe=embedded_eval", f"{key}={typo}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_stopped_in_validation(proc, imported)
    assert f"{key}='{typo}': path does not exist" in proc.stderr
    assert not typo.parent.exists()


def test_data_options():
    assert sorted(p.stem for p in (CONF / "data").glob("*.yaml")) == ["digit_task", "prompt_file"]
    embedded = compose_config([]).data  # the embedded preset's digit task
    assert embedded.prompt_data == embedded.generator.path and embedded.prompt_data.endswith("/digit_task_train.jsonl")
    assert compose_config(["data=prompt_file"]).data.prompt_data is None  # the command line beats the preset
    cfg = typed_config(["model=qwen3_4b"])
    assert cfg.data.prompt_data is None and cfg.data.generator is None


def test_help_lists_the_registered_names():
    proc = subprocess.run([sys.executable, "main.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listing = {
        line.split()[0]: line.split(None, 1)[1]
        for line in proc.stdout.splitlines()
        if line.startswith("  ")
        and line.split()[0]
        in ("parallelism.backend", "rollout.engine", "rollout.weight_sync.mode", "rollout.rm_type", "rollout.function")
    }
    assert listing == {
        "parallelism.backend": "fsdp, megatron",
        "rollout.engine": "hf, sglang, vllm",
        "rollout.weight_sync.mode": "disk, distributed, tensor",
        "rollout.rm_type": "dapo, deepscaler, exact_match, f1, first_word, gpqa, last_number, math, remote_rm",
        "rollout.function": "default, sft",
    }
    assert (
        "model: glm4_9b, llama3_8b, qwen2_5_7b, qwen3_0_6b, qwen3_1_7b, qwen3_1p7b, qwen3_30b_a3b, qwen3_4b, qwen3_8b, "
        "tiny_qwen3, tiny_qwen3_moe" in proc.stdout
    )
