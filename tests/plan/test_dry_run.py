"""debug=dry_run: the placement plan, batch arithmetic and memory estimate of GPU configs, on CPU, starting nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slime.plan.derive import derive
from slime.plan.dry_run import dry_run
from slime.plan.memory import GIB, estimate_memory, memory_plan_gib, micro_batch_tokens, parameter_count
from tests.helpers.compose import ROOT, typed_config

GPU_RUN = [
    # the estimates below are of fsdp shards and the hf engine's batches (qwen3_4b's preset: megatron, SGLang)
    "model=qwen3_4b",
    "parallelism=fsdp",
    "rollout=hf",
    "data.prompt_data=/nonexistent/train.jsonl",
    "rollout.rm_type=exact_match",
    "debug=dry_run",
]


def plan_of(overrides: list[str]) -> list[str]:
    lines: list[str] = []
    assert dry_run(typed_config([*GPU_RUN, *overrides]), out=lines.append) == 0, "\n".join(lines)
    return "\n".join(lines).splitlines()


def still_needed(lines: list[str]) -> dict[str, str]:
    """The dry run's "Still needed by a real launch" section: key -> its line (without the bullet)."""
    start = lines.index("Still needed by a real launch (not on this machine, or not given yet):") + 1
    items = [line.removeprefix("  - ") for line in lines[start:] if line.startswith("  - ")]
    return {item.partition("=")[0]: item for item in items}


def test_colocated_one_node_8gpu_plan():
    lines = plan_of(["cluster=one_node_8gpu", "cluster.colocate=true", "cluster.actor.num_gpus_per_node=8"])
    gpus = [line.strip() for line in lines if line.startswith("  node ")]
    assert gpus == [f"node 0 GPU {i}: actor rank {i} (dp {i}, tp 0, pp 0, cp 0) + engine {i}" for i in range(8)]
    assert any("router" in line and "driver's node" in line for line in lines)
    assert "Placement plan (8 GPU(s) of 1 node(s) x 8; colocated;" in lines[lines.index("Stack:") + 4]


def test_disaggregated_two_node_plan_with_tensor_parallel():
    lines = plan_of(
        [
            "cluster=one_node_8gpu",
            "cluster.num_nodes=2",
            "cluster.host=0.0.0.0",
            "cluster.actor.num_gpus_per_node=8",
            "cluster.rollout.num_gpus=8",
            "rollout.hf.max_batch_size=8",
            "parallelism.tp=2",
        ]
    )
    gpus = [line.strip() for line in lines if line.startswith("  node ")]
    # tp is fastest: ranks 0, 1 share dp shard 0; the engines fill the second node.
    assert gpus[:3] == [
        "node 0 GPU 0: actor rank 0 (dp 0, tp 0, pp 0, cp 0)",
        "node 0 GPU 1: actor rank 1 (dp 0, tp 1, pp 0, cp 0)",
        "node 0 GPU 2: actor rank 2 (dp 1, tp 0, pp 0, cp 0)",
    ]
    assert gpus[7:] == ["node 0 GPU 7: actor rank 7 (dp 3, tp 1, pp 0, cp 0)"] + [
        f"node 1 GPU {i}: engine {i}" for i in range(8)
    ]
    assert "  rollout step: 32 prompts x 8 samples = 256 samples" in lines
    assert "  = 1 optimizer step(s) x global batch 256 samples = 4 data-parallel rank(s) x 64 samples" in lines


def test_default_8gpu_plan_is_4_trainers_4_engines_and_machine_checks_are_still_needed():
    lines = plan_of(["cluster=one_node_8gpu"])
    gpus = [line.strip() for line in lines if line.startswith("  node ")]
    assert gpus[3:5] == ["node 0 GPU 3: actor rank 3 (dp 3, tp 0, pp 0, cp 0)", "node 0 GPU 4: engine 0"]
    needed = still_needed(lines)
    assert needed["data.prompt_data"].startswith("data.prompt_data='/nonexistent/train.jsonl': path does not exist")
    assert needed["model.hf_checkpoint"].endswith(
        "no such directory. Fix: download the HF checkpoint to a directory and set "
        "model.hf_checkpoint=<dir> (absolute paths are safest)"
    )
    assert "the run needs 8 GPU(s)" in needed["cluster.device"]


def test_engine_line_counts_each_models_engines_by_size():
    lines = plan_of(["cluster=one_node_8gpu"])
    assert any(line.endswith("samples; 4 engine(s) x 1 GPU(s)") for line in lines), lines
    models = (
        "rollout.models=[{name: actor, server_groups: [{num_gpus: 4, num_gpus_per_engine: 2}]},"
        " {name: ref, update_weights: false, server_groups: [{num_gpus: 2}]}]"
    )
    lines = plan_of(
        ["cluster=one_node_8gpu", "cluster.actor.num_gpus_per_node=2", "cluster.rollout.num_gpus=6", models]
    )
    assert any(line.endswith("samples; 2 engine(s) x 2 GPU(s) (actor), 2 engine(s) x 1 GPU(s) (ref)") for line in lines)


def test_config_errors_still_fail_the_dry_run():
    lines: list[str] = []
    cfg = typed_config([*GPU_RUN, "train.global_batch_size=100"])
    assert dry_run(cfg, out=lines.append) == 2
    assert "train.global_batch_size=100" in lines[0] and "Placement plan" not in "\n".join(lines)


def test_moe_parameters_count_every_expert_and_megatron_splits_them_by_ep():
    cfg = typed_config(
        ["recipe=gpu/qwen3_30b_a3b_grpo_ep", "data.prompt_data=/nonexistent/train.jsonl", "debug=dry_run"]
    )
    assert parameter_count(cfg)[0] == 30_532_122_624  # Qwen3-30B-A3B: the published total (128 experts, untied)
    experts = 48 * 128 * 3 * 2048 * 768
    est = estimate_memory(cfg, derive(cfg))
    dense = (30_532_122_624 - experts) / 4  # tp 4
    assert est.train["gradients"] == pytest.approx(4 * (dense + experts / 8))
    # the recipe's 16 GPUs: dp 4 for the dense part, 16 / ep 8 = 2 expert-data-parallel ranks for the experts
    assert est.train["optimizer"] == pytest.approx(12 * (dense / 4 + experts / 8 / 2))


def test_unequal_pipeline_stages_count_the_fullest_stage():
    """DeepSeek-V3's 61 layers over pp 4 with 13 on the last stage: a GPU of the first three holds 16/61 of the
    model's tp (and ep) share, where equal stages would hold a quarter."""
    cfg = typed_config(["recipe=gpu/deepseek_v3_grpo", "data.prompt_data=/nonexistent/train.jsonl", "debug=dry_run"])
    n = parameter_count(cfg)[0]
    experts = 58 * 256 * 3 * 7168 * 2048  # 58 MoE layers of 256 routed experts
    est = estimate_memory(cfg, derive(cfg))
    assert est.train["gradients"] == pytest.approx(4 * 16 / 61 * ((n - experts) / 8 + experts / 64))  # tp 8, ep 64


def test_frozen_models_take_gpu_memory_where_the_backend_keeps_them_there():
    """fsdp holds the reference and the teacher whole on every rank's GPU (bf16: 2 B a parameter, not sharded)
    unless train.ref_offload; megatron swaps host copies into the policy's own tensors, so they take none."""
    kl = ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.001", "checkpoint.ref_load=/nonexistent/ref"]
    opd = ["algo.use_opd=true", "model@teacher=qwen3_4b"]
    cfg = typed_config([*GPU_RUN, "cluster=one_node_8gpu", *kl, *opd])
    n = parameter_count(cfg)[0]
    est = estimate_memory(cfg, derive(cfg))
    assert est.train["reference"] == est.train["teacher"] == pytest.approx(2 * n)
    assert est.train["gradients"] == pytest.approx(4 * n / 4)  # the policy's state is sharded: dp 4, tp 1
    offloaded = typed_config([*GPU_RUN, "cluster=one_node_8gpu", *kl, *opd, "train.ref_offload=true"])
    assert estimate_memory(offloaded, derive(offloaded)).train["reference"] == 0.0
    megatron = typed_config([*GPU_RUN, "cluster=one_node_8gpu", "parallelism=megatron", *kl, *opd])
    est = estimate_memory(megatron, derive(megatron))
    assert est.train["reference"] == est.train["teacher"] == 0.0 and est.train["weights"] > 0


AUTOCAST = "parallelism.fsdp.mixed_precision=autocast"


def test_with_lora_only_the_adapters_have_gradients_and_optimizer_state():
    """fsdp shards (dp 4): the frozen base's weights are bf16 under FSDP2's bf16 policy (fp32 under autocast), the
    adapters add their fp32 ones; gradients (4 B) and AdamW's moments (8 B) exist for the adapters alone; the plan
    prints how many train."""
    full = typed_config([*GPU_RUN, "cluster=one_node_8gpu"])
    cfg = typed_config([*GPU_RUN, "cluster=one_node_8gpu", "model.lora.rank=16"])
    m = cfg.model
    q, kv, h, f = (
        m.num_attention_heads * m.kv_channels,
        m.num_query_groups * m.kv_channels,
        m.hidden_size,
        m.ffn_hidden_size,
    )
    adapters = m.num_layers * 16 * ((h + q) * 2 + (h + kv) * 2 + (h + f) * 3)
    assert m.lora.parameter_count(m) == adapters
    lora, base = estimate_memory(cfg, derive(cfg)).train, estimate_memory(full, derive(full)).train
    assert lora["gradients"] == pytest.approx(4 * adapters / 4) and lora["optimizer"] == pytest.approx(8 * adapters / 4)
    shard = parameter_count(cfg)[0] / 4
    assert lora["weights"] == pytest.approx(base["weights"] - 2 * shard + 4 * adapters / 4)
    autocast = typed_config([*GPU_RUN, "cluster=one_node_8gpu", "model.lora.rank=16", AUTOCAST])
    assert estimate_memory(autocast, derive(autocast)).train["weights"] == pytest.approx(
        base["weights"] + 4 * adapters / 4
    )
    kl = typed_config([*GPU_RUN, "cluster=one_node_8gpu", "model.lora.rank=16", "algo.use_kl_loss=true"])
    assert estimate_memory(kl, derive(kl)).train["reference"] == 0.0  # the policy with its adapters off
    line = next(line for line in plan_of(["cluster=one_node_8gpu", "model.lora.rank=16"]) if "LoRA rank 16" in line)
    assert f"{adapters:,} trainable parameters" in line


@pytest.mark.parametrize(
    ("backend", "recompute", "every_layer"),
    [
        (["parallelism=fsdp"], ["parallelism.gradient_checkpointing=true"], True),
        (["parallelism=megatron"], ["parallelism.recompute.granularity=full"], True),
        (["parallelism=megatron"], ["parallelism.recompute.granularity=null"], False),  # the switch is fsdp's
        (["parallelism=megatron"], ["parallelism.recompute.granularity=selective"], False),  # counted as none
    ],
)
def test_activations_count_what_a_layer_keeps_unless_the_backend_recomputes_every_layer(
    backend, recompute, every_layer
):
    """Per token and layer, bf16: 3 hidden-wide, 3 query-wide, 3 kv-wide and 4 FFN-wide tensors, or with every layer
    recomputed the layer inputs plus one layer's (the backend's record names its switch)."""
    sizes = ["parallelism.max_tokens_per_gpu=16384", "parallelism.gradient_checkpointing=true"]
    cfg = typed_config([*GPU_RUN, "cluster=one_node_8gpu", *backend, *sizes, *recompute])
    m = cfg.model
    q, kv = m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels
    layer = 2 * (3 * m.hidden_size + 3 * q + 3 * kv + 4 * m.ffn_hidden_size)
    expected = 16384 * (m.num_layers * m.hidden_size * 2 + layer) if every_layer else 16384 * m.num_layers * layer
    assert estimate_memory(cfg, derive(cfg)).train["activations"] == pytest.approx(expected)


def test_activations_are_sized_by_the_fullest_micro_batch_the_config_allows():
    """A full micro-batch: micro_batch_size samples (at most a rank's samples of one optimizer step), or
    max_tokens_per_gpu (at most those samples' tokens), each sample rollout.max_prompt_len (1024 assumed where
    unset) + max_response_len tokens; the plan prints the figure and why, and a run's measured fullest micro-batch
    re-sizes it."""
    base = [*GPU_RUN, "cluster=one_gpu", "rollout.max_response_len=96", "parallelism.micro_batch_size=64"]
    base += ["parallelism.max_tokens_per_gpu=null"]
    cfg = typed_config([*base, "train.global_batch_size=128"])
    bound = micro_batch_tokens(cfg, derive(cfg))
    assert bound.tokens == 64 * (1024 + 96) and "assumed: rollout.max_prompt_len unset" in bound.reason
    cfg = typed_config([*base, "train.global_batch_size=128", "rollout.max_prompt_len=131"])
    assert micro_batch_tokens(cfg, derive(cfg)).tokens == 64 * (131 + 96)
    line = next(
        line for line in plan_of([*base[len(GPU_RUN) :], "rollout.max_prompt_len=131"]) if "full micro-batches" in line
    )
    assert line.startswith(f"  activations for full micro-batches of {64 * 227} tokens: 64 samples")
    few = typed_config([*base, "train.global_batch_size=16", "rollout.max_prompt_len=131"])
    assert micro_batch_tokens(few, derive(few)).tokens == 16 * 227  # a rank never packs more than its step's samples
    tokens = [*base, "train.global_batch_size=16", "rollout.max_prompt_len=131"]
    for limit, expected in ((1000, 1000), (100_000, 16 * 227), (100, 227)):  # one sample over the limit is alone
        cfg = typed_config([*tokens, f"parallelism.max_tokens_per_gpu={limit}"])
        assert micro_batch_tokens(cfg, derive(cfg)).tokens == expected, limit
    cfg = typed_config([*base, "train.global_batch_size=128", "rollout.max_prompt_len=131"])
    full, measured = estimate_memory(cfg, derive(cfg)), estimate_memory(cfg, derive(cfg), micro_batch=5000)
    assert measured.train["activations"] == pytest.approx(full.train["activations"] * 5000 / (64 * 227))
    assert {k: v for k, v in measured.train.items() if k != "activations"} == {
        k: v for k, v in full.train.items() if k != "activations"
    }
    kept = memory_plan_gib(cfg, derive(cfg), 5000)
    assert kept == {
        "trainer": pytest.approx(full.train_peak / GIB),
        "engine": pytest.approx(full.engine_total / GIB),
        "micro_batch_tokens": 64 * 227,
        "trainer_sized": pytest.approx(measured.train_peak / GIB),
        "largest_micro_batch_tokens": 5000,
    }
    assert "trainer_sized" not in memory_plan_gib(cfg, derive(cfg), None)


def test_memory_estimate_numbers_and_colocation_warning():
    cfg = typed_config([*GPU_RUN, "cluster=one_node_8gpu", "rollout.hf.max_batch_size=8", "debug.gpu_memory_gib=80"])
    n, _ = parameter_count(cfg)
    assert n == 4_022_468_096  # Qwen3-4B: the published parameter count (tied embeddings)
    est = estimate_memory(cfg, derive(cfg))
    shard = n / 4  # fsdp: dp 4, tp 1
    assert est.train["gradients"] == pytest.approx(4 * shard) and est.train["optimizer"] == pytest.approx(8 * shard)
    assert est.engine["weights"] == pytest.approx(2 * n)
    # 8 sequences x (1024 + 8192) tokens x 2 (k, v) x 36 layers x 8 kv heads x 128 x 2 B
    assert est.engine["kv_cache"] == pytest.approx(8 * 9216 * 2 * 36 * 8 * 128 * 2)
    assert est.warnings() == []
    # the graphs' slots: 6 sequences held as 8, 1024 + 1000 tokens as 2048 columns; without graphs as they are
    odd = [*GPU_RUN, "cluster=one_node_8gpu", "rollout.hf.max_batch_size=6", "rollout.max_response_len=1000"]
    slots = estimate_memory(cfg := typed_config(odd), derive(cfg)).engine["kv_cache"]
    assert slots == pytest.approx(8 * 2048 * 2 * 36 * 8 * 128 * 2)
    plain = estimate_memory(cfg := typed_config([*odd, "rollout.hf.cuda_graphs=false"]), derive(cfg))
    assert plain.engine["kv_cache"] == pytest.approx(6 * 2024 * 2 * 36 * 8 * 128 * 2)
    # the preset's hf engine decodes 256 sequences of 1024 + 8192 tokens: 324 GiB of KV cache on one GPU
    wide = estimate_memory(
        cfg := typed_config([*GPU_RUN, "cluster=one_node_8gpu", "debug.gpu_memory_gib=80"]), derive(cfg)
    )
    assert wide.warnings() == [
        "an engine GPU needs ~331.5 GiB but a GPU holds 80 GiB: lower rollout.hf.max_batch_size (sequences decoded "
        "together) or rollout.max_response_len"
    ]
    sglang = typed_config(
        [*GPU_RUN, "rollout.engine=sglang", "+rollout.sglang.mem_fraction_static=0.5", "debug.gpu_memory_gib=80"]
    )
    est = estimate_memory(sglang, derive(sglang))
    assert est.engine["kv_cache"] == pytest.approx(0.5 * 80 * GIB - 2 * n) and est.engine_total == 40 * GIB
    tight = typed_config(
        [
            *GPU_RUN,
            "cluster=one_gpu",
            "rollout.hf.max_batch_size=64",
            "debug.gpu_memory_gib=24",
            "train.global_batch_size=256",
        ]
    )
    est = estimate_memory(tight, derive(tight))
    assert est.colocated and est.peak > 24 * GIB
    assert "colocated GPU" in est.warnings()[0]


def test_cli_dry_run_exits_0_without_importing_ray():
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('RAY_IMPORTED', 'ray' in sys.modules))\n"
        f"sys.argv = ['main.py', *{GPU_RUN!r}, 'cluster=one_node_8gpu']\n"
        "runpy.run_path('main.py', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "node 0 GPU 7: engine 3" in proc.stdout
    assert "RAY_IMPORTED False" in proc.stdout


# ---- what this machine lacks is planned, not refused -------------------------------------------------------------
def run_main(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "main.py", *overrides], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


@pytest.mark.parametrize("recipe", ["gpu/qwen3_4b_grpo_disagg", "gpu/qwen3_4b_sft"])
def test_a_gpu_recipe_without_data_or_checkpoint_is_planned_with_what_it_still_needs(recipe):
    dry = run_main(f"recipe={recipe}", "debug=dry_run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == "Stack:" and lines[4].startswith("Placement plan (8 GPU(s) of 1 node(s) x 8;")
    assert "Memory per GPU" in dry.stdout
    needed = still_needed(lines)
    assert needed["data.prompt_data"] == (
        "data.prompt_data=None: no prompt data. Fix: set data.prompt_data=<file.jsonl> (your prompts) or pick "
        "data=digit_task (the synthetic task)"
    )
    assert needed["model.hf_checkpoint"].endswith(
        "no such directory. Fix: download the HF checkpoint to a directory and set "
        "model.hf_checkpoint=<dir> (absolute paths are safest)"
    )
    assert "cluster.device" in needed  # this machine has no GPU
    assert lines[-1] == "Dry run: configuration valid; nothing was started."
    launch = run_main(f"recipe={recipe}")  # launched for real, the same inputs are refused before anything starts
    assert launch.returncode == 2, launch.stderr
    assert "Configuration error: invalid configuration" in launch.stderr and "Traceback" not in launch.stderr
    assert "  - data.prompt_data=None: no prompt data." in launch.stderr
    assert "  - model.hf_checkpoint=" in launch.stderr


def test_a_reward_not_given_yet_is_still_needed_but_a_misspelt_one_is_an_error():
    needed = still_needed(plan_of(["cluster=one_node_8gpu", "rollout.rm_type=null"]))
    assert needed["rollout.rm_type"].startswith("rollout.rm_type=None: no reward")
    lines: list[str] = []
    assert dry_run(typed_config([*GPU_RUN, "rollout.rm_type=exact_matsh"]), out=lines.append) == 2
    assert "rollout.rm_type='exact_matsh'" in lines[0] and "Placement plan" not in "\n".join(lines)


# ---- the dry run prints the plan the driver executes -----------------------------------------------------------------
DRIVER_PLAN = """\
import runpy, sys
import slime.driver.driver as driver
from slime.plan.dry_run import plan_text

def run(job, *args, **kwargs):  # the driver's entry: print the plan it was handed instead of running it
    print("DRIVER PLAN BEGIN", plan_text(job.cfg, job.plan), "DRIVER PLAN END", sep="\\n")

driver.run = run
sys.argv = ["main.py", *sys.argv[1:]]
runpy.run_path("main.py", run_name="__main__")
"""


def test_the_dry_run_prints_the_plan_the_driver_is_handed(tmp_path):
    overrides = ["algo=ppo", "cluster.rollout.num_gpus=2", f"hydra.run.dir={tmp_path}", "logger.progress=false"]
    launch = subprocess.run(
        [sys.executable, "-c", DRIVER_PLAN, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert launch.returncode == 0, launch.stderr[-3000:]
    handed = launch.stdout.split("DRIVER PLAN BEGIN\n")[1].split("\nDRIVER PLAN END")[0]
    dry = run_main(*overrides, "debug=dry_run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == handed + "\nDry run: configuration valid; nothing was started.\n"
    assert "  node 0 CPU slot 1: critic rank 0\n  node 0 CPU slot 2: engine 0\n  node 0 CPU slot 3: engine 1" in handed


def stack_of(overrides: list[str]) -> list[str]:
    """The dry run's lines naming the training backend, the engine and the resources (its first section)."""
    lines: list[str] = []
    assert dry_run(typed_config(["debug=dry_run", *overrides]), out=lines.append) == 0, "\n".join(lines)
    lines = "\n".join(lines).splitlines()
    return lines[: lines.index("Stack:") + 4]


def test_the_dry_run_names_the_training_backend_and_the_engine_in_workers_on_cpu():
    assert stack_of([]) == [
        "Stack:",
        "  trainer: fsdp (PyTorch FSDP2 over a transformers model): 1 worker, dp 1, fp32",
        "  engine: hf (built-in transformers server): 1 engine x 1 worker, behind sglang-router (launched)",
        "  resources: CPU, 1 node: trainer workers 1, engine workers 1 (disaggregated)",
    ]
    dp2 = stack_of(["recipe=embedded_dp2"])
    assert dp2[1] == "  trainer: fsdp (PyTorch FSDP2 over a transformers model): 2 workers, dp 2, fp32"
    assert not any("GPU" in line for line in dp2)


def test_the_dry_run_names_megatron_sglang_and_vllm_with_their_gpus():
    production = ["model=qwen3_4b", "data.prompt_data=/nonexistent/train.jsonl", "rollout.rm_type=exact_match"]
    assert stack_of([*production, "parallelism.tp=2"])[1:] == [
        "  trainer: megatron (Megatron-core GPTModel): 4 GPUs, dp 2 x tp 2, bf16",
        "  engine: sglang (SGLang servers): 4 engines x 1 GPU, behind sglang-router (launched)",
        "  resources: 8 GPUs of 1 node x 8: trainer GPUs 4, engine GPUs 4 (disaggregated)",
    ]
    ppo = stack_of([*production, "algo=ppo", "cluster.critic.colocate_with_actor=true", "rollout=vllm"])
    assert ppo[1] == "  trainer: megatron (Megatron-core GPTModel): 4 GPUs, dp 4, bf16; critic on the same 4 GPUs"
    assert ppo[2] == "  engine: vllm (vLLM servers): 4 engines x 1 GPU, behind vllm-router (launched)"
