"""GPU tier: the megatron backend on CUDA in bf16 (varlen attention), against transformers on the same weights.

A small Qwen3 shape (4 layers, hidden 512, 8 query / 4 KV heads of 64, vocab 4096), and the Qwen3-1.7B shape
with random weights (the benchmarks' shape), both created locally. Prints the mean absolute log-prob
difference: bf16 rounding, not a different model (on the 1.7B shape, megatron in fp32 is checked against
transformers in fp32 too). The small shape's bar is 0.02.
"""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from slime.assets.tiny_model import create_tiny_model  # noqa: E402
from slime.config.schema import ModelConfig  # noqa: E402
from slime.run_schema import schema_class  # noqa: E402
from slime.train.megatron.model_config import compile_layers  # noqa: E402
from tests.helpers import megatron_standalone as standalone  # noqa: E402
from tests.helpers.compose import model_fields  # noqa: E402
from tests.helpers.hf_reference import hf_cuda_log_probs  # noqa: E402


def small_qwen3(path) -> ModelConfig:
    return ModelConfig(
        name="small_qwen3",
        hf_checkpoint=str(path),
        architecture="qwen3",
        num_layers=4,
        hidden_size=512,
        ffn_hidden_size=1536,
        num_attention_heads=8,
        num_query_groups=4,
        kv_channels=64,
        vocab_size=4096,
        rotary_base=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        init_std=0.02,
    )


def rl_samples(n: int, vocab: int, seed: int = 0, *, longest_response: int = 600) -> standalone.Samples:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(16, 200))]
        response = [rng.randrange(4, vocab) for _ in range(rng.randint(8, longest_response))]
        out.append((prompt + response, [1] * len(response)))
    return out


def test_bf16_log_probs_match_transformers_and_a_step_trains(tmp_path):
    model_cfg = small_qwen3(tmp_path / "small_qwen3")
    create_tiny_model(model_cfg, model_cfg.hf_checkpoint)
    samples = rl_samples(8, model_cfg.vocab_size)
    backend = standalone.build(model_cfg, device="cuda", precision="bf16", lr=1e-5, max_tokens_per_gpu=2048)
    ours = standalone.forward_log_probs(backend, samples).cpu()
    theirs = hf_cuda_log_probs(model_cfg.hf_checkpoint, samples)
    diff = (ours - theirs).abs().mean().item()
    print(f"megatron bf16 vs transformers bf16: mean |log-prob diff| = {diff:.5f} over {ours.numel()} tokens")
    assert diff < 0.02

    step = standalone.train_step(backend, samples)
    assert torch.isfinite(torch.tensor(step["train/grad_norm"])) and step["train/grad_norm"] > 0
    after = standalone.forward_log_probs(backend, samples).cpu()
    # advantages alternate +1 / -1 by sample: the step raises the first kind relative to the second
    change = [d.mean().item() for d in torch.split(after - ours, [len(m) for _, m in samples])]
    assert sum(change[0::2]) / len(change[0::2]) > sum(change[1::2]) / len(change[1::2])
    backend.shutdown()


def test_log_probs_match_transformers_on_the_1p7b_shape(tmp_path):
    """Qwen3-1.7B shape, random weights. In fp32 megatron is transformers' model (1e-4). In bf16 the mean |log-prob
    diff| to transformers' bf16 run is printed (docs/performance.md#numerical-parity-of-the-backends); asserted is that
    megatron's bf16 error against the exact fp32 values is no larger than transformers' own bf16 error, plain and with
    compiled layers (inductor, forward and backward). Measured on an H200 (2026-11-27): megatron bf16 vs transformers
    bf16 0.0265; against the fp32 values megatron bf16 0.0266, transformers bf16 0.0271, transformers under bf16
    autocast 0.0219: at this depth with random weights, bf16 rounding moves log-probs by about 0.027 in either
    implementation, and moving one rounding point moves them as far: transformers with its SwiGLU rounded once instead
    of twice is 0.020 off its own bf16 run (CPU, 28 layers, 2026-11-27), so only a bit-identical implementation would be
    closer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime.assets.tiny_model import hf_config_dict

    model_cfg = ModelConfig(**{**model_fields("qwen3_1_7b"), "hf_checkpoint": str(tmp_path / "qwen3_1p7b")})
    torch.manual_seed(0)
    config = AutoConfig.for_model(**hf_config_dict(model_cfg, eos_token_id=0, pad_token_id=0))
    with torch.device("cuda"):  # random init on the GPU: seconds, not minutes
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_cfg.hf_checkpoint)
    samples = rl_samples(6, model_cfg.vocab_size, seed=1, longest_response=2048)
    exact = hf_cuda_log_probs(model_cfg.hf_checkpoint, samples, dtype=torch.float32)
    theirs = hf_cuda_log_probs(model_cfg.hf_checkpoint, samples)
    parallelism = schema_class("parallelism")(backend="megatron", max_tokens_per_gpu=8192)

    backend = standalone.build(model_cfg, device="cuda", precision="fp32", parallelism=parallelism)
    fp32_diff = (standalone.forward_log_probs(backend, samples).cpu() - exact).abs().mean().item()
    backend.shutdown()
    del backend
    torch.cuda.empty_cache()
    print(f"1.7B shape, megatron fp32 vs transformers fp32: mean |log-prob diff| = {fp32_diff:.2e}")
    assert fp32_diff < 1e-4

    backend = standalone.build(model_cfg, device="cuda", precision="bf16", parallelism=parallelism)
    plain = standalone.forward_log_probs(backend, samples).cpu()
    compile_layers([chunk.module for chunk in backend.model])
    compiled = standalone.forward_log_probs(backend, samples).cpu()
    their_error = (theirs - exact).abs().mean().item()
    print(f"1.7B shape, transformers bf16 vs transformers fp32: mean |log-prob diff| = {their_error:.5f}")
    for name, ours in (("plain", plain), ("compiled layers", compiled)):
        diff = (ours - theirs).abs().mean().item()
        our_error = (ours - exact).abs().mean().item()
        print(
            f"1.7B shape, megatron bf16 ({name}): vs transformers bf16 {diff:.5f}, vs transformers fp32 {our_error:.5f}"
        )
        assert our_error <= 1.1 * their_error, name
        assert diff < 0.04, name
    step = standalone.train_step(backend, samples)  # the compiled layers' backward
    assert torch.isfinite(torch.tensor(step["train/grad_norm"])) and step["train/grad_norm"] > 0
    backend.shutdown()


SEQUENCE_PARALLEL = {"tp": 2, "sequence_parallel": True}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (tensor parallel over NCCL)")
@pytest.mark.xfail(
    strict=True,
    reason="on two H200s in fp32, tp=2 log-probs differ from one GPU's by up to 8.4e-3 (2.2e-2 with sequence "
    "parallelism) while dp=2 equals it exactly and the grad norms agree to 1e-4; over gloo on CPU tp=2 equals one "
    "rank to 1e-6: a CUDA tensor-parallel difference not found yet",
)
@pytest.mark.parametrize(
    "option,layouts",
    [
        ("tiny_qwen3", {"tp2": {"tp": 2}, "tp2_sp": SEQUENCE_PARALLEL}),
        ("tiny_glm4_moe", {"tp2_sp_etp2": {**SEQUENCE_PARALLEL, "etp": 2}, "tp2_ep2": {**SEQUENCE_PARALLEL, "ep": 2}}),
    ],
)
def test_sequence_parallel_over_two_gpus_equals_one(option, layouts, tmp_path):
    """tp=2 with sequence parallelism (megatron's MoE layers need it with tp; the experts split over tp), and with
    ep=2 (the experts whole on each rank), over NCCL, fp32, against one GPU: log-probs to 1e-5, the first step's grad norm to 1e-4 (the same
    layouts over gloo: tests/train/megatron/test_parallel.py)."""
    from slime.net import free_port
    from tests.helpers.megatron_layouts import assert_layouts_equal_one_rank, tiny_option_dir

    model_dir = tiny_option_dir(option, [], tmp_path / option)
    base = [
        f"model={option}",
        "parallelism=megatron",
        "parallelism.max_tokens_per_gpu=24",
        "train.lr=1e-2",
        "cluster=one_gpu",
        "cluster.num_gpus_per_node=2",
    ]
    assert_layouts_equal_one_rank(model_dir, base, layouts, tmp_path, free_port())
