"""Configs fit the choice: the preset group follows the model (preset=${model}) and sizes the run; a model option
chooses a model only; `python main.py` alone is the embedded run.

CLI tests run main.py as a user does. A configuration error must stop the run in validation: exit 2, one
message naming every key with its fix, nothing written where the config points, and Ray never imported.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml

from slime.config.schema import ModelConfig
from slime.plan.validate import collect_problems
from tests.helpers.compose import CONF, ROOT, compose_config, typed_config
from tests.helpers.runs import assert_stopped_in_validation, run_main

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
    "preset": "quickstart_8gpu",
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
    "cluster.colocate": False,
    "cluster.actor.num_gpus_per_node": 4,
    "cluster.rollout.num_gpus": 4,
    "cluster.rollout.num_gpus_per_engine": 1,
    "data.prompt_data": None,
    "data.input_key": "prompt",
    "data.label_key": "label",
    "data.apply_chat_template": True,
    "data.generator": None,
    "parallelism.max_tokens_per_gpu": 16384,
    "parallelism.gradient_checkpointing": True,
}
# slime's quick start is the production stack: megatron training (every layer recomputed, as slime's flags), SGLang
# engines (weights broadcast: disaggregated).
PRODUCTION_STACK = {
    "parallelism.backend": "megatron",
    "parallelism.recompute.granularity": "full",
    "parallelism.recompute.method": "uniform",
    "parallelism.recompute.num_layers": 1,
    "rollout.engine": "sglang",
    "rollout.weight_sync.mode": "distributed",
}
BUILT_IN_STACK = {"parallelism.backend": "fsdp", "rollout.engine": "hf", "rollout.weight_sync.mode": "disk"}
GROUP_OF_PRESETS = ("cluster", "parallelism", "rollout", "data")


def cfg_job(*overrides: str) -> dict:
    """`python main.py ... --cfg job`, parsed."""
    proc = subprocess.run(
        [sys.executable, "main.py", *overrides, "--cfg", "job"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_embedded_run_is_the_default():
    printed = cfg_job()
    assert {key: lookup(printed, key) for key in EMBEDDED} == EMBEDDED
    assert {key: lookup(printed, key) for key in BUILT_IN_STACK} == BUILT_IN_STACK
    assert printed["preset"] == "embedded"
    assert printed["data"]["generator"]["_target_"] == "slime.assets.digit_task.write_dataset"
    assert printed["checkpoint"]["ref_load"] == "${model.hf_checkpoint}"


def test_embedded_config_is_the_golden_one():
    """Every key and value of `python main.py --cfg job` as tests/helpers/embedded_cfg_job.yaml keeps them, plus
    the preset's label: the embedded run (and so its metrics) does not depend on how presets are chosen."""
    golden = yaml.safe_load((ROOT / "tests" / "helpers" / "embedded_cfg_job.yaml").read_text())
    printed = cfg_job()
    assert printed.pop("preset") == "embedded"
    assert printed == golden


@pytest.mark.parametrize("model,name", [("qwen3_4b", "Qwen3-4B"), ("qwen3_1_7b", "Qwen3-1.7B")])
def test_production_model_composes_the_seeds_run(model, name):
    """model=qwen3_4b algo=grpo: slime's quick start on one 8-GPU node (4 train + 4 rollout), megatron + SGLang."""
    printed = cfg_job(f"model={model}", "algo=grpo")
    assert {key: lookup(printed, key) for key in PRODUCTION} == PRODUCTION
    assert {key: lookup(printed, key) for key in PRODUCTION_STACK} == PRODUCTION_STACK
    assert printed["model"]["hf_checkpoint"].endswith(f"/checkpoints/{name}")
    assert printed["checkpoint"]["ref_load"] == "${model.hf_checkpoint}"


def test_fsdp_and_the_built_in_engine_are_one_override_away():
    cfg = typed_config(["model=qwen3_4b", "algo=grpo", "parallelism=fsdp", "rollout=hf"])
    assert (cfg.parallelism.backend, cfg.rollout.engine, cfg.rollout.weight_sync.mode) == ("fsdp", "hf", "disk")
    # megatron's recompute goes with the backend (fsdp recomputes by gradient_checkpointing): the config validates
    assert (cfg.parallelism.recompute.granularity, cfg.parallelism.gradient_checkpointing) == (None, True)
    # nothing of the stack is wrong; what is left is the user's inputs, data and reward (the preset leaves both to
    # you), which a dry run lists as still needed (Problem.machine) and a launch refuses
    problems = collect_problems(cfg)
    assert [p.key for p in problems if not p.machine] == []
    assert {"data.prompt_data", "rollout.rm_type"} <= {p.key for p in problems}
    # the preset's cluster and sizes stay
    assert (cfg.cluster.num_gpus_per_node, cfg.rollout.max_response_len, cfg.parallelism.max_tokens_per_gpu) == (
        8,
        8192,
        16384,
    )


def test_preset_none_keeps_the_groups_first_options():
    dcfg = compose_config(["model=qwen3_4b", "preset=none"])
    assert (dcfg.preset, dcfg.cluster.device, dcfg.parallelism.backend, dcfg.rollout.engine) == (
        "none",
        "cpu",
        "fsdp",
        "hf",
    )
    assert dcfg.data.prompt_data is None and dcfg.data.generator is None  # data=prompt_file
    assert dcfg.model.name == "qwen3_4b" and dcfg.parallelism.max_tokens_per_gpu is None
    # no sizes: the batch is the user's to state, by its key
    cfg = typed_config(["preset=none", "rollout.batch_size=4"])
    assert (cfg.rollout.batch_size, cfg.rollout.max_response_len, cfg.model.name) == (4, 1024, "tiny_qwen3")
    proc, imported = run_main("preset=none")
    assert proc.returncode == 2 and "rollout.batch_size" in proc.stderr and "ray" not in imported


def test_a_size_preset_none_leaves_unset_is_a_config_error_naming_the_key_and_the_fix():
    proc, imported = run_main("preset=none", "train.num_rollout=???")
    assert_stopped_in_validation(proc, imported)
    assert "Traceback" not in proc.stderr and "Missing mandatory value" not in proc.stderr
    assert "invalid configuration (2 problems)" in proc.stderr, proc.stderr
    fix = "Fix: set it on the command line ({key}=<value>), or choose a preset: preset=<deepseek_v3, embedded, "
    for key in ("rollout.batch_size", "train.num_rollout"):
        assert f"  - {key}='???': is mandatory and nothing in the composed config sets it" in proc.stderr
        assert fix.format(key=key) in proc.stderr
    assert (
        "preset=<deepseek_v3, embedded, " in proc.stderr and ", none," not in proc.stderr and "qwen3_4b" in proc.stderr
    )
    cfg = typed_config(["preset=none", "rollout.batch_size=4"])  # stated on the command line: it composes
    assert cfg.rollout.batch_size == 4


def test_preset_is_chosen_explicitly():
    cfg = typed_config(["model=tiny_qwen3", "preset=quickstart_8gpu"])
    assert (cfg.preset, cfg.model.name, cfg.cluster.num_gpus_per_node, cfg.parallelism.backend) == (
        "quickstart_8gpu",
        "tiny_qwen3",
        8,
        "megatron",
    )
    cfg = typed_config(["model=qwen3_4b", "preset=embedded"])
    assert (cfg.preset, cfg.cluster.device, cfg.rollout.max_response_len, cfg.model.name) == (
        "embedded",
        "cpu",
        2,
        "qwen3_4b",
    )


def test_glm4_preset_trains_with_fsdp():
    """GLM-4's layers are not on megatron-core's layer spec: its quick start is fsdp + SGLang, the same sizes."""
    glm, qwen = typed_config(["model=glm4_9b"]), typed_config(["model=qwen3_8b"])
    assert (glm.preset, glm.parallelism.backend, glm.rollout.engine) == ("glm4_9b", "fsdp", "sglang")
    assert (glm.train, glm.cluster, glm.data) == (qwen.train, qwen.cluster, qwen.data)
    assert glm.rollout.batch_size == qwen.rollout.batch_size and glm.rollout.max_response_len == 8192


def test_every_model_option_has_its_preset_and_chooses_a_model_only():
    """conf/preset/<model option>.yaml exists for each model option (preset=${model} resolves); a model option
    holds ModelConfig fields only (no defaults list, no package of its own); every preset either lists the groups it
    chooses (cluster, parallelism, rollout, data) or extends exactly one such preset."""
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    options = {p.stem for p in (CONF / "model").glob("*.yaml")}
    presets = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF / "preset").glob("*.yaml")}
    assert options <= set(presets)
    for option in options:
        text = (CONF / "model" / f"{option}.yaml").read_text()
        assert "@package" not in text and set(yaml.safe_load(text)) <= model_keys, option
    stacks = {}
    for name, body in presets.items():
        defaults = body["defaults"]
        if len(defaults) == 1:  # extends one preset
            assert defaults[0] in presets and len(presets[defaults[0]]["defaults"]) > 1, name
            continue
        groups = {next(iter(d)): next(iter(d.values())) for d in defaults if isinstance(d, dict)}
        chosen = {group.lstrip("/"): option for group, option in groups.items() if group.startswith("/")}
        assert list(chosen) == list(GROUP_OF_PRESETS) and body["preset"] == name, name
        assert set(groups) - {f"/{g}" for g in GROUP_OF_PRESETS} <= {"optional recompute"}, name
        assert groups.get("optional recompute", "${parallelism}") == "${parallelism}", name
        stacks[name] = chosen
    assert stacks["none"] == {"cluster": "local_cpu", "parallelism": "fsdp", "rollout": "hf", "data": "prompt_file"}
    assert stacks["quickstart_8gpu"] == {
        "cluster": "one_node_8gpu",
        "parallelism": "megatron",
        "rollout": "sglang",
        "data": "prompt_file",
    }


def test_root_config_holds_no_group_values():
    root = yaml.safe_load((CONF / "config.yaml").read_text())
    assert set(root) == {"defaults", "seed", "hydra"}
    entries = [next(iter(d.items())) for d in root["defaults"] if isinstance(d, dict)]
    # Hydra's own groups overridden at the end: no log of Hydra's (slime/driver/console.py owns the handlers)
    hydra_groups = [(key, value) for key, value in entries if key.startswith("override hydra/")]
    assert hydra_groups == [("override hydra/job_logging", "none")]
    entries = [(key, value) for key, value in entries if (key, value) not in hydra_groups]
    assert entries[-4:] == [("model", "tiny_qwen3"), ("model@teacher", None), ("preset", "${model}"), ("recipe", None)]
    assert not set(GROUP_OF_PRESETS) & {group for group, _ in entries}  # the preset chooses them


def test_removed_alias_names_the_option_it_stood_for(tmp_path):
    proc, imported = run_main("model=qwen3_1p7b", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and "ray" not in imported
    assert proc.stderr.startswith(
        "Configuration error: model=qwen3_1p7b: no such option of group model (did you mean qwen3_1_7b"
    )
    assert not (tmp_path / "run").exists()


def test_command_line_beats_the_preset():
    cfg = typed_config(["model=qwen3_4b", "cluster=local_cpu", "data=digit_task", "rollout.max_response_len=16"])
    assert (cfg.cluster.device, cfg.rollout.max_response_len, cfg.train.num_rollout) == ("cpu", 16, 3000)
    assert cfg.data.prompt_data == cfg.data.generator["path"]


def test_recipe_overlays_the_preset():
    cfg = typed_config(["recipe=qwen3_4b_grpo"])
    assert (cfg.preset, cfg.parallelism.backend, cfg.rollout.engine) == ("quickstart_8gpu", "fsdp", "hf")
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
    assert sorted(p.stem for p in (CONF / "data").glob("*.yaml")) == [
        "arithmetic",
        "digit_task",
        "image_prompt_file",
        "lookup_task",
        "messages_file",
        "prompt_file",
        "shape_count",
        "tool_task",
    ]
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
        "model: deepseek_v3, glm4_5, glm4_5_air, glm4_9b, llama3_8b, moonlight_16b_a3b, qwen2_5_7b, qwen2_5_vl_3b, "
        "qwen2_5_vl_7b, qwen3_0_6b, qwen3_1_7b, qwen3_30b_a3b, qwen3_4b, qwen3_8b, qwen3_vl_4b, qwen3_vl_8b, "
        "smollm2_135m, tiny_deepseek_v3, tiny_glm4_moe, tiny_qwen2_5_vl, tiny_qwen3, tiny_qwen3_moe" in proc.stdout
    )
    presets = next(line for line in proc.stdout.splitlines() if line.startswith("preset: "))
    assert {"none", "embedded", "quickstart_8gpu", "qwen3_4b", "tiny_qwen3"} <= set(presets[8:].split(", "))
    assert "`preset` follows the model (model=NAME\ncomposes preset NAME" in proc.stdout
    assert "\npreset: embedded\n" in proc.stdout  # the composed config names its preset
