"""Model FLOPs (slime.models.flops, the formula tools/bench_train.py shares) and the training rates every rollout
step logs: perf/train_tokens_per_s, perf/train_tflops (per GPU) and perf/mfu against cluster.peak_tflops."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime.models.flops import TRAIN_PASSES, active_ffn_width, forward_flops, head_flops_per_token, train_flops
from slime.train.throughput import seconds_since, shard_train_flops, train_rates
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout

TINY = typed_config([]).model  # tiny_qwen3: L 2, H 64, 4 heads x 16 (Q 64), 2 KV heads (KV 32), F 192, V 80


def test_forward_flops_of_the_tiny_model_by_hand():
    # per layer: 2·(64·64 + 2·64·32 + 64·64) + 6·64·192 + 2·64·S = 98304 + 128·S; two layers; head 2·64·80 = 10240
    assert head_flops_per_token(TINY) == 10240
    assert forward_flops(TINY, [(10, 4)]) == 10 * 2 * (98304 + 128 * 10) + 4 * 10240
    assert forward_flops(TINY, [(10, 4), (3, 0)]) == forward_flops(TINY, [(10, 4)]) + 3 * 2 * (98304 + 128 * 3)


def test_with_lora_the_frozen_weights_count_two_passes_attention_and_adapters_three():
    # (10, 4) on TINY: weight matmuls 10·2·98304 + 4·10240 (the head), attention 10·2·128·10; the rank-4 adapters on
    # every projection: 9728 parameters, 2 FLOPs each per token
    lora = dataclasses.replace(TINY, lora=dataclasses.replace(TINY.lora, rank=4, train_params=["model.norm.weight"]))
    weights, attention = 10 * 2 * 98304 + 4 * 10240, 10 * 2 * 128 * 10
    assert lora.lora.adapter_parameter_count(lora) == 9728
    assert train_flops(TINY, [(10, 4)]) == 3 * (weights + attention)
    assert train_flops(lora, [(10, 4)]) == 2 * weights + 3 * (attention + 2 * 9728 * 10)
    batch = batches_for(make_samples(4, seed=1), dp=1, k=1)[0]
    sequences = [(len(t), r) for t, r in zip(batch.tokens, batch.response_lengths)]
    assert shard_train_flops(lora, batch) == train_flops(lora, sequences) < shard_train_flops(TINY, batch)


def test_an_moe_token_passes_through_its_top_k_experts_and_the_shared_one():
    moe = typed_config(["model=tiny_qwen3_moe"]).model
    expected = moe.moe_router_topk * moe.moe_ffn_hidden_size + (moe.moe_shared_expert_intermediate_size or 0)
    assert active_ffn_width(moe) == expected != moe.ffn_hidden_size
    assert active_ffn_width(TINY) == TINY.ffn_hidden_size


def test_rates_are_per_gpu_and_mfu_needs_a_peak():
    totals = torch.tensor([8e12, 4000.0], dtype=torch.float64)  # FLOPs and tokens over the data-parallel ranks
    rates = train_rates(totals, seconds=2.0, num_gpus=4, peak_tflops=2.0)
    assert rates == {"perf/train_tokens_per_s": 2000.0, "perf/train_tflops": 1.0, "perf/mfu": 0.5}
    assert "perf/mfu" not in train_rates(totals, seconds=2.0, num_gpus=4, peak_tflops=None)


@pytest.mark.parametrize("peak", [None, 0.004])
def test_a_training_step_logs_its_rates(tiny_model_dir, peak):
    """One fsdp rank on CPU: the logged TFLOP/s times the logged train time are the shard's model FLOPs (the LM head
    on the response tokens only); MFU only against a given peak (CPU runs measure none); no GPU memory on CPU."""
    overrides = [] if peak is None else [f"cluster.peak_tflops={peak}"]
    backend = make_backend(make_setup(tiny_model_dir, overrides))
    batch = batches_for(make_samples(8, seed=5), dp=1, k=1)[0]
    perf = train_rollout(backend, batch)["perf"]
    seconds = perf["perf/actor_train_time"]
    sequences = [(len(t), r) for t, r in zip(batch.tokens, batch.response_lengths)]
    flops = TRAIN_PASSES * forward_flops(TINY, sequences)
    assert shard_train_flops(TINY, batch) == flops
    assert perf["perf/train_tflops"] * 1e12 * seconds == pytest.approx(flops, rel=1e-9)
    assert perf["perf/train_tokens_per_s"] * seconds == pytest.approx(sum(n for n, _ in sequences), rel=1e-9)
    if peak is None:
        assert "perf/mfu" not in perf
    else:
        assert perf["perf/mfu"] == pytest.approx(perf["perf/train_tflops"] / peak, rel=1e-12)
    assert not any(k.startswith("perf/peak_gib/") for k in perf)


def test_a_peak_must_be_positive():
    from tests.helpers.validation import config_problems

    assert "must be > 0" in config_problems(["cluster.peak_tflops=0"])["cluster.peak_tflops"]


def test_a_phase_on_cuda_is_timed_until_its_queued_work_has_finished(monkeypatch):
    """The optimizer's last kernels still run when `train()` returns; the clock is read after the device drains
    (on an H200 the step's own TFLOP/s read 1.016x the bench's synchronised figure without it, 1.005x with it)."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", device)))
    monkeypatch.setattr("slime.train.throughput.time.perf_counter", lambda: events.append(("clock", None)) or 5.0)
    cuda = torch.device("cuda", 0)
    assert seconds_since(2.0, cuda) == 3.0
    assert events == [("sync", cuda), ("clock", None)]
    events.clear()
    assert seconds_since(2.0, torch.device("cpu")) == 3.0 and events == [("clock", None)]
