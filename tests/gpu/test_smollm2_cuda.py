"""GPU tier: real pretrained weights (SmolLM2-135M-Instruct) through the megatron backend in bf16 against
transformers in bf16, on answers the model itself sampled to the arithmetic task (T=0.7, as the recipe rolls
out), each bf16 run's distance from transformers' fp32 values beside it.

Measured on an H100 (2026-11-28, 1070 tokens): megatron bf16 vs transformers bf16 0.0213 (a bar of 0.02
is not met); vs the fp32 values megatron bf16 0.0155 and transformers bf16 0.0162. The two roundings are
independent and equally good, so asserted is that megatron's bf16 error is no larger than transformers' own
(as on the 1.7B shape in test_megatron_cuda) and that the two stay within 0.025 of each other."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("GPU tier: bf16 parity on a CUDA device (docs/testing.md#the-gpu-tier)", allow_module_level=True)

from tests.helpers import megatron_standalone as standalone  # noqa: E402
from tests.helpers.arithmetic_samples import templated_prompts  # noqa: E402
from tests.helpers.compose import typed_config  # noqa: E402
from tests.helpers.hf_reference import hf_cuda_log_probs  # noqa: E402


def sampled_answers(model_dir: str, num: int, *, max_new_tokens: int = 96) -> standalone.Samples:
    """`num` prompts, each with a response transformers samples at T=0.7 (seeded), through its end token."""
    from transformers import AutoModelForCausalLM

    prompts, _ = templated_prompts(model_dir, num)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    torch.manual_seed(0)
    samples = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt], device="cuda"),
                do_sample=True,
                temperature=0.7,
                max_new_tokens=max_new_tokens,
            )[0, len(prompt) :].tolist()
            end = next((i + 1 for i, t in enumerate(out) if t in eos), len(out))
            samples.append((prompt + out[:end], [1] * end))
    del model
    torch.cuda.empty_cache()
    return samples


def test_megatron_bf16_matches_transformers_bf16_on_smollm2(smollm2_dir):
    model_cfg = dataclasses.replace(typed_config(["model=smollm2_135m"]).model, hf_checkpoint=smollm2_dir)
    samples = sampled_answers(smollm2_dir, 32)
    exact = hf_cuda_log_probs(smollm2_dir, samples, dtype=torch.float32)
    theirs = hf_cuda_log_probs(smollm2_dir, samples)
    backend = standalone.build(model_cfg, device="cuda", precision="bf16")
    ours = standalone.forward_log_probs(backend, samples).cpu()
    backend.shutdown()
    diff = (ours - theirs).abs().mean().item()
    print(
        f"SmolLM2-135M, {ours.numel()} sampled response tokens (mean log-prob {exact.mean().item():.3f}): "
        f"megatron bf16 vs transformers bf16 {diff:.5f}; vs transformers fp32: megatron bf16 "
        f"{(ours - exact).abs().mean().item():.5f}, transformers bf16 {(theirs - exact).abs().mean().item():.5f}"
    )
    assert exact.mean() < -0.01  # real sampled answers, not all certain
    assert (ours - exact).abs().mean() <= 1.1 * (theirs - exact).abs().mean()
    assert diff < 0.025
