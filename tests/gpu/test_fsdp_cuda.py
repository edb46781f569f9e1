"""GPU tier: the fsdp backend on CUDA (FSDP2 over NCCL, bf16 autocast), against the CPU fp32 reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime.net import free_port
from tests.helpers.fsdp_rank import (
    TP_OVERRIDES,
    batches_for,
    log_probs,
    make_backend,
    make_samples,
    make_setup,
    run_tp_group,
    train_rollout,
)

pytestmark = pytest.mark.gpu


def test_fsdp2_bf16_training_on_cuda(tiny_model_dir, tmp_path):
    base = make_setup(
        tiny_model_dir,
        ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.1", f"checkpoint.ref_load={tiny_model_dir}", "train.lr=1e-2"],
    )
    samples = make_samples(16, seed=3)
    batch = batches_for(samples, dp=1, k=2)[0]

    cpu = make_backend(base)
    cpu_log_probs = log_probs(cpu, batch).clone()

    gpu_setup = dataclasses.replace(base, device="cuda", precision="bf16")
    gpu = make_backend(gpu_setup, port=free_port())
    assert type(gpu.model).__name__.startswith("FSDP")
    gpu_log_probs = log_probs(gpu, batch).cpu()
    # bf16 matmuls against the fp32 CPU reference: same policy, small rounding differences
    assert (gpu_log_probs - cpu_log_probs).abs().mean() < 0.02

    steps = train_rollout(gpu, batch)["steps"]
    assert steps[0]["train/ppo_kl"] == 0.0 and steps[0]["train/pg_clipfrac"] == 0.0
    assert abs(steps[0]["train/kl_loss"]) < 1e-3  # actor (FSDP2) vs ref (plain module), both bf16 autocast
    assert steps[1]["train/kl_loss"] > steps[0]["train/kl_loss"]
    assert all(torch.isfinite(torch.tensor(s["train/grad_norm"])) for s in steps)

    cpu_steps = train_rollout(cpu, batch)["steps"]
    assert steps[0]["train/grad_norm"] == pytest.approx(cpu_steps[0]["train/grad_norm"], rel=0.05)

    gpu.save_hf(str(tmp_path / "hf"))
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(gpu.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    for name, tensor in reloaded.state_dict().items():
        if name in full:
            torch.testing.assert_close(tensor, full[name].float(), rtol=0, atol=0)
    gpu.shutdown()


def test_fsdp2_critic_on_cuda(tiny_model_dir):
    from slime.train.fsdp.critic import FSDPCritic

    base = make_setup(tiny_model_dir, ["algo=ppo", "train.lr=1e-2"])
    setup = dataclasses.replace(base, device="cuda", precision="bf16")
    critic = make_backend(setup, port=free_port(), cls=FSDPCritic)
    batch = batches_for(make_samples(8, seed=4), dp=1, k=2)[0]
    critic.load_batch(0, batch)
    values = critic.compute_values()
    assert all(v == 0.0 for sample in values for v in sample)  # zero-initialised value head
    critic.set_column("returns", [[1.0] * len(v) for v in values])
    steps = critic.train()["steps"]
    assert steps[0]["train/value_loss"] > steps[1]["train/value_loss"] > 0  # moving towards the returns
    after = critic.compute_values()
    assert sum(v for sample in after for v in sample) > 0
    critic.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (tensor parallel over NCCL)")
def test_fsdp2_with_tensor_parallel_on_two_gpus(tiny_model_dir, tmp_path):
    """dp=1 × tp=2 over NCCL (FSDP2 on the dp dimension, DTensor tp) against one GPU, both bf16."""
    from slime.train.layout import RankLayout

    base = make_setup(tiny_model_dir, [*TP_OVERRIDES, f"checkpoint.ref_load={tiny_model_dir}"])
    setup = dataclasses.replace(base, device="cuda", precision="bf16")
    samples = make_samples(16, seed=7)
    (single,) = run_tp_group(setup, samples, RankLayout(dp=1), tmp_path / "one", free_port())
    ranks = run_tp_group(setup, samples, RankLayout(dp=1, tp=2), tmp_path / "tp2", free_port())
    assert ranks[0]["sharded"]
    assert (ranks[0]["log_probs"] - single["log_probs"]).abs().mean() < 0.02  # bf16 rounding only
    # The on-policy first step: ratio ≡ 1 in both layouts, so pg_loss agrees to float rounding; the gradient
    # to bf16 rounding. (After a 1e-2 update the two bf16 policies drift apart, so later steps are not compared.)
    mine, ref = ranks[0]["result"]["steps"][0], single["result"]["steps"][0]
    assert mine["train/ppo_kl"] == ref["train/ppo_kl"] == 0.0
    assert mine["train/pg_loss"] == pytest.approx(ref["train/pg_loss"], rel=1e-5, abs=1e-6)
    assert mine["train/grad_norm"] == pytest.approx(ref["train/grad_norm"], rel=0.05)
    assert ranks[0]["result"]["steps"] == ranks[1]["result"]["steps"]


def test_fsdp2_mixed_precision_policy_matches_autocast(tiny_model_dir):
    """parallelism.fsdp.mixed_precision: FSDP2's policy keeps fp32 shards (the optimizer's state) and computes
    in bf16 like autocast does; both give the same log-probs to bf16 rounding, and the first step is on-policy."""
    base = make_setup(tiny_model_dir, ["train.lr=1e-2"])
    batch = batches_for(make_samples(16, seed=5), dp=1, k=2)[0]
    results = {}
    for mode in ("fsdp2", "autocast"):
        parallelism = dataclasses.replace(
            base.parallelism, fsdp=dataclasses.replace(base.parallelism.fsdp, mixed_precision=mode)
        )
        setup = dataclasses.replace(base, device="cuda", precision="bf16", parallelism=parallelism)
        backend = make_backend(setup, port=free_port())
        assert all(p.dtype == torch.float32 for p in backend.model.parameters())
        results[mode] = log_probs(backend, batch).cpu()
        steps = train_rollout(backend, batch)["steps"]
        assert steps[0]["train/ppo_kl"] == 0.0
        backend.shutdown()
    assert (results["fsdp2"] - results["autocast"]).abs().mean() < 0.02


def test_a_lora_policy_holds_its_frozen_base_in_bf16(tiny_model_dir):
    """FSDP2's bf16 policy with model.lora: the base's shards are bf16, the adapters and their AdamW state fp32; the
    first forward is the full model's (fp32 shards cast to the same bf16 values, B = 0) up to bf16 rounding (the
    compiled layers fuse the adapter's sum differently: 1e-3 seen on an H200), and the reference is the base itself
    (the adapters off)."""
    gpu = ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.1", f"checkpoint.ref_load={tiny_model_dir}"]
    batch = batches_for(make_samples(16, seed=3), dp=1, k=2)[0]
    full = make_backend(dataclasses.replace(make_setup(tiny_model_dir, gpu), device="cuda", precision="bf16"))
    full_log_probs = log_probs(full, batch).cpu()
    full.shutdown()

    setup = make_setup(tiny_model_dir, [*gpu, "model.lora.rank=4", "train.lr=1e-2"])
    lora_gpu = make_backend(dataclasses.replace(setup, device="cuda", precision="bf16"), port=free_port())
    params = dict(lora_gpu.model.named_parameters())
    trained = {n for n, p in params.items() if p.requires_grad}  # the adapters and the preset's trained norm gain
    assert any(".lora_" in n for n in trained) and {params[n].dtype for n in trained} == {torch.float32}
    assert {p.dtype for n, p in params.items() if n not in trained} == {torch.bfloat16}
    assert "ref" in lora_gpu.frozen and lora_gpu.frozen["ref"] is lora_gpu.model  # no second copy
    assert (log_probs(lora_gpu, batch).cpu() - full_log_probs).abs().mean() < 0.02

    steps = train_rollout(lora_gpu, batch)["steps"]
    assert steps[0]["train/ppo_kl"] == 0.0 and abs(steps[0]["train/kl_loss"]) < 1e-3  # B = 0: policy = base
    assert steps[1]["train/kl_loss"] > steps[0]["train/kl_loss"]
    assert all(torch.isfinite(torch.tensor(s["train/grad_norm"])) for s in steps)
    states = [v for state in lora_gpu.optimizer.state.values() for v in state.values() if v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}
    assert (log_probs(lora_gpu, batch, "ref").cpu() - full_log_probs).abs().mean() < 0.02  # the base, untrained
    lora_gpu.shutdown()
