"""Every option of every config group composes and validates; each validation rule fires with the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from slime.plan.derive import derive
from slime.plan.validate import validate
from tests.helpers.compose import ROOT, fake_hf_dir, group_options, typed_config
from tests.helpers.recipes import prompt_file, recipe_overrides, recipe_selecting
from tests.helpers.validation import config_problems

GPU_MODELS = (
    *("qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_30b_a3b", "qwen2_5_7b", "llama3_8b", "glm4_9b"),
    *("glm4_5", "glm4_5_air", "deepseek_v3", "moonlight_16b_a3b", "qwen2_5_vl_3b", "qwen2_5_vl_7b"),
    *("qwen3_vl_4b", "qwen3_vl_8b"),
)
# Options that need resources this CPU machine lacks get exactly what they need to validate here.
NEEDS = {
    **{("model", name): "hf_model_dir+gpu_cluster+prompt_file+reward" for name in GPU_MODELS},
    # a model's preset is composed with that model (preset=${model}), quickstart_8gpu with qwen3_4b's
    **{("preset", name): "hf_model_dir+gpu_cluster+prompt_file+reward" for name in GPU_MODELS},
    ("preset", "quickstart_8gpu"): "hf_model_dir+gpu_cluster+prompt_file+reward",
    ("preset", "none"): "prompt_file+sizes+reward",
    ("preset", "tiny_qwen2_5_vl"): "vision_model",  # the preset follows its model (its data holds images)
    ("preset", "tiny_qwen3_vl"): "vision_model",
    ("data", "shape_count"): "vision_model",
    ("preset", "embedded_vllm"): "vllm_cpu_model",
    ("preset", "tiny_qwen3_vllm"): "vllm_cpu_model",
    ("preset", "tiny_qwen3_vllm_untied"): "vllm_cpu_model",
    ("cluster", "one_node_8gpu"): "gpu_cluster",
    ("cluster", "one_gpu"): "gpu_cluster",
    ("cluster", "two_nodes_16gpu"): "gpu_cluster",
    ("cluster", "four_nodes_32gpu"): "gpu_cluster",
    ("recipe", "qwen3_4b_grpo"): "hf_model_dir+gpu_cluster+prompt_file",
    ("data", "prompt_file"): "prompt_file",
    ("data", "image_prompt_file"): "prompt_file+vision_model",
    ("debug", "train_only"): "rollout_dumps",
    ("rollout", "vllm"): "vllm_cpu_model",
    # layouts of the recipes' models and clusters: composed and validated within the recipe that chooses them
    **{
        (group, option): "recipe"
        for group, options in {
            "cluster": (
                "local_cpu_two_trainers",
                "one_node_8gpu_colocated",
                "one_node_8gpu_colocated_one_engine",
                "one_node_8gpu_critic_colocated",
                "two_nodes_16gpu_colocated",
                "two_nodes_16gpu_colocated_one_engine",
                "eight_nodes_64gpu_colocated",
                "sixteen_nodes_128gpu_colocated",
                "thirty_two_nodes_256gpu_colocated",
            ),
            "parallelism": (
                "fsdp_tp2",
                "megatron_tp2_sp",
                "megatron_tp4_sp_ep8",
                "megatron_tp2_sp_pp2_ep32",
                "megatron_tp4_sp_pp4_ep32",
                "megatron_tp8_sp_pp4_ep64",
            ),
            "rollout": (
                "sglang_colocated",
                "sglang_colocated_large",
                "vllm_colocated",
                "vllm_colocated_expert_parallel",
            ),
            "data": ("messages_file",),
        }.items()
        for option in options
    },
}


@pytest.mark.parametrize("group,option", group_options())
def test_every_option_composes_and_validates(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    needs = NEEDS.get((group, option), "")
    if needs == "recipe":
        overrides = [*recipe_overrides(recipe_selecting(group, option), tmp_path), *overrides]
    if "hf_model_dir" in needs:
        model = option if option in GPU_MODELS else "qwen3_4b"
        overrides += [f"model={model}", f"model.hf_checkpoint={fake_hf_dir(tmp_path, model)}"]
    if "gpu_cluster" in needs:
        overrides.append("cluster.ray_address=auto")  # validated against a remote cluster, not this machine
    if "sizes" in needs:  # preset=none sizes nothing: the batch, the run's length and the response length are yours
        overrides += ["rollout.batch_size=32", "train.num_rollout=10", "rollout.max_response_len=64"]
    if "reward" in needs:
        overrides.append("rollout.rm_type=exact_match")
    if "prompt_file" in needs:  # records with an image too (data=image_prompt_file reads it)
        overrides.append(f"data.prompt_data={prompt_file(tmp_path, num_prompts=1)}")
    if "vision_model" in needs:  # a vision preset's own model, else the tiny Qwen2.5-VL
        overrides.append(f"model={option if group == 'preset' else 'tiny_qwen2_5_vl'}")
    if "vllm_cpu_model" in needs:  # the embedded model's head size is not one vLLM's CPU attention takes
        overrides.append("model=tiny_qwen3_vllm")
    if "rollout_dumps" in needs:  # one (here empty) dump per rollout of the embedded run
        dumps = tmp_path / "rollout_data"
        dumps.mkdir()
        for i in range(typed_config([]).train.num_rollout):
            (dumps / f"{i}.jsonl").touch()
        overrides.append(f"debug.load_rollout_data={dumps}")
    cfg = typed_config(overrides)
    derived = validate(cfg)
    assert (
        derived.global_batch_size * cfg.train.num_steps_per_rollout
        == cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    )


def test_default_derived_values():
    cfg = typed_config([])
    d = validate(cfg)
    assert (d.actor_gpus, d.critic_gpus, d.rollout_gpus, d.dp_size, d.total_gpus) == (1, 0, 1, 1, 2)
    assert (d.samples_per_rollout, d.global_batch_size, d.precision) == (256, 128, "fp32")


def test_dp2_recipe_and_derived_global_batch():
    cfg = typed_config(["recipe=embedded_dp2", "train.global_batch_size=null", "train.num_steps_per_rollout=4"])
    d = derive(cfg)
    assert (d.dp_size, d.global_batch_size, d.samples_per_dp_rank, d.total_gpus) == (2, 64, 32, 3)


def test_batch_arithmetic_names_both_sides_and_the_fix():
    found = config_problems(["train.global_batch_size=100"])
    assert "32 × 8 = 256" in found["train.global_batch_size"] and "100 × 2 = 200" in found["train.global_batch_size"]
    assert "train.global_batch_size=128" in found["train.global_batch_size"]


def test_gpu_counts_that_do_not_fit():
    found = config_problems(["cluster.actor.num_gpus_per_node=3", "cluster.rollout.num_gpus=2"])
    assert "needs 5 GPU(s)" in found["cluster.actor.num_gpus_per_node"]
    found = config_problems(
        ["cluster.rollout.num_gpus=3", "cluster.rollout.num_gpus_per_engine=2", "cluster.num_gpus_per_node=8"]
    )
    assert "not a multiple" in found["cluster.rollout.num_gpus"]


def test_missing_paths(tmp_path):
    found = config_problems(
        [
            f"checkpoint.load={tmp_path}/nope",
            f"checkpoint.ref_load={tmp_path}/nope2",
            f"data.prompt_data={tmp_path}/nope3.jsonl",
            "data.generator=null",
        ]
    )
    assert set(found) >= {"checkpoint.load", "checkpoint.ref_load", "data.prompt_data"}
    assert all("does not exist" in found[k] for k in ("checkpoint.load", "checkpoint.ref_load", "data.prompt_data"))


def test_kl_loss_without_reference():
    found = config_problems(["algo.use_kl_loss=true", "checkpoint.ref_load=null"])
    assert "reference model" in found["algo.use_kl_loss"] and "checkpoint.ref_load" in found["algo.use_kl_loss"]


def test_temperature_must_be_positive():
    assert "must be > 0" in config_problems(["rollout.temperature=0"])["rollout.temperature"]
    assert "rollout.temperature" in config_problems(["rollout.temperature=-1"])


def test_model_checkpoint_mismatch(tmp_path):
    path = fake_hf_dir(tmp_path, "qwen3_4b")
    found = config_problems(["model=qwen3_4b", f"model.hf_checkpoint={path}", "model.hidden_size=1024"])
    assert "hidden_size=2560" in found["model.hidden_size"]


def test_all_problems_reported_together():
    found = config_problems(
        ["rollout.temperature=0", "train.global_batch_size=7", "algo.use_kl_loss=true", "checkpoint.ref_load=null"]
    )
    assert {"rollout.temperature", "train.global_batch_size", "algo.use_kl_loss"} <= set(found)


@pytest.mark.parametrize(
    "overrides,keys",
    [
        (["rollout.batchsize=3"], ["batchsize"]),  # refused while composing
        (  # refused by validation, every problem in one message
            [
                "train.global_batch_size=100",
                "cluster.actor.num_gpus_per_node=3",
                "cluster.rollout.num_gpus=2",
                "checkpoint.load=/definitely/not/here",
                "data.prompt_data=/definitely/not/here.jsonl",
                "data.generator=null",
                "algo.use_kl_loss=true",
                "checkpoint.ref_load=null",
                "rollout.temperature=0",
            ],
            [
                "train.global_batch_size",
                "cluster.actor.num_gpus_per_node",
                "checkpoint.load",
                "data.prompt_data",
                "algo.use_kl_loss",
                "rollout.temperature",
            ],
        ),
    ],
)
def test_cli_exits_2_naming_the_key_and_starts_nothing(overrides, keys, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "main.py", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert [key for key in keys if key not in proc.stderr] == [], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "result.json").exists() and not (run_dir / "metrics.jsonl").exists()


def test_cfg_job_prints_composed_config():
    proc = subprocess.run(
        [sys.executable, "main.py", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["rollout"]["batch_size"] == 32 and printed["model"]["name"] == "tiny_qwen3"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["parallelism.sequence_parallel=true"], "parallelism.sequence_parallel"),
        (["parallelism.fsdp.mixed_precision=fp8"], "parallelism.fsdp.mixed_precision"),
        (["+parallelism.megatron.recompute_granularity=full"], "parallelism.megatron"),
        (["+rollout.sglang.mem_fraction_static=0.7"], "rollout.sglang"),
        (["cluster.critic.num_gpus_per_node=1"], "cluster.critic.num_gpus_per_node"),
        (["algo.kl_coef=0.01"], "algo.kl_coef"),
        (["parallelism.pp=2", "cluster.actor.num_gpus_per_node=2"], "parallelism.pp"),
        # tp splits heads, kv heads and the FFN: the tiny model has 4 heads and 2 kv groups
        (["parallelism.tp=4", "cluster.actor.num_gpus_per_node=4"], "parallelism.tp"),
    ],
)
def test_options_the_chosen_parts_cannot_honour_are_rejected(overrides, key):
    assert key in config_problems(overrides)


def test_fsdp_tensor_parallel_is_accepted():
    derived = validate(
        typed_config(["parallelism.tp=2", "cluster.actor.num_gpus_per_node=4", "cluster.num_gpus_per_node=5"])
    )
    assert derived.actor_gpus == 4 and derived.dp_size == 2


def test_deterministic_engine_batching():
    """rollout.deterministic: the hf engine batches requests with batch-invariant forward passes on the CPU with one
    torch thread, and decodes them one at a time elsewhere (derived, saved in config.yaml)."""
    assert derive(typed_config([])).hf_max_batch_size == 256  # the embedded default is deterministic, on the CPU
    assert derive(typed_config(["rollout.hf.num_threads=2"])).hf_max_batch_size == 1
    assert derive(typed_config(["rollout.deterministic=false", "rollout.hf.num_threads=2"])).hf_max_batch_size == 256
    assert derive(typed_config(["rollout.deterministic=false", "rollout.hf.max_batch_size=8"])).hf_max_batch_size == 8
    assert validate(typed_config(["rollout.hf.max_batch_size=8"])).hf_max_batch_size == 8
    found = config_problems(["rollout.hf.max_batch_size=8", "rollout.hf.num_threads=2"])
    assert "rollout.hf.num_threads=1" in found["rollout.hf.max_batch_size"]


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["debug.signal_at=nowhere"], "debug.signal_at"),
        (["debug.signal_at=train:x"], "debug.signal_at"),
        (["debug.signal_at=train:1", "debug.signal=SIGHUP"], "debug.signal"),
    ],
)
def test_signal_injection_is_validated(overrides, key):
    assert key in config_problems(overrides)
