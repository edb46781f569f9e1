"""The megatron model against transformers on the same weights, and recompute against none (one CPU rank)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.net import free_port  # noqa: E402
from slime.train.layout import RankLayout  # noqa: E402
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup  # noqa: E402
from tests.helpers.megatron_layouts import tiny_option_dir  # noqa: E402
from tests.helpers.megatron_logprobs import hf_log_probs, megatron_run  # noqa: E402

MODEL_OF_KIND = {
    "dense": None,
    "moe": "tiny_qwen3_moe",
    "glm4_moe": "tiny_glm4_moe",
    "deepseek_v3": "tiny_deepseek_v3",
}


# Moonlight's kind of latent attention: no q bottleneck, RoPE unscaled
OPTIONS_OF_KIND = {"moonlight": ("tiny_deepseek_v3", ["model.q_lora_rank=null", "model.rope_scaling=null"])}


@pytest.mark.parametrize("kind", [*MODEL_OF_KIND, *OPTIONS_OF_KIND])
def test_log_probs_equal_transformers(kind, tiny_model_dir, tmp_path):
    """Qwen3ForCausalLM / Qwen3MoeForCausalLM / Glm4MoeForCausalLM / DeepseekV3ForCausalLM and the megatron model
    loaded from the same HF directory (GLM-4.5's: a dense first layer, then the sigmoid router with a random
    expert-score bias, which changes the experts chosen, four routed experts and a shared one; half of each head
    rotated. DeepSeek-V3's: latent attention with a q bottleneck and YaRN, the same router over two groups of experts)."""
    overrides = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=32", "rollout.temperature=0.7"]
    model_dir = tiny_model_dir
    option, model_overrides = OPTIONS_OF_KIND.get(kind, (MODEL_OF_KIND.get(kind), []))
    if option is not None:
        overrides[:0] = [f"model={option}", *model_overrides]
        model_dir = tiny_option_dir(option, model_overrides, tmp_path / kind)
    setup = make_setup(model_dir, overrides)
    batch = batches_for(make_samples(6, seed=5), dp=1, k=1)[0]
    ours = megatron_run(setup, batch, 29650 + [*MODEL_OF_KIND, *OPTIONS_OF_KIND].index(kind))["log_probs"]
    theirs = hf_log_probs(model_dir, batch, temperature=0.7)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_recompute_and_compiled_layers_change_nothing(tiny_model_dir):
    """Full recompute, selective recompute of attention and MLP, and layers captured by torch.compile's
    dynamo (graph breaks and guards as on CUDA; the "eager" backend runs the captured graphs without
    inductor's CPU codegen, which tests/gpu/test_megatron_cuda.py covers) give the same log-probs and
    gradient norm as the plain model."""
    base = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=24"]
    batch = batches_for(make_samples(6, seed=6), dp=1, k=1)[0]
    plain = megatron_run(make_setup(tiny_model_dir, base), batch, 29655, train=True)
    variants = {
        "full": ["parallelism.recompute.granularity=full", "parallelism.recompute.num_layers=1"],
        "selective": [
            "parallelism.recompute.granularity=selective",
            "parallelism.recompute.modules=[core_attn,mlp]",
        ],
        "compiled": [],
    }
    for port, (name, overrides) in enumerate(variants.items(), start=29656):
        setup = make_setup(tiny_model_dir, base + overrides)
        again = megatron_run(setup, batch, port, train=True, compile_backend="eager" if name == "compiled" else None)
        torch.testing.assert_close(again["log_probs"], plain["log_probs"], rtol=0, atol=1e-6, msg=name)
        grad_norm = again["steps"][0]["train/grad_norm"]
        assert grad_norm == pytest.approx(plain["steps"][0]["train/grad_norm"], rel=1e-5), name


def test_critic_values_start_at_zero_and_fit_the_returns(tiny_model_dir):
    """PPO's critic on the megatron backend: a zero value head, then the clipped value loss falls."""
    from slime.train.megatron.critic import MegatronCritic

    setup = make_setup(tiny_model_dir, ["parallelism=megatron", "algo=ppo", "train.lr=1e-2"])
    batch = batches_for(make_samples(6, seed=7), dp=1, k=1)[0]
    critic = MegatronCritic(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    critic.init()
    try:
        losses = []
        for rollout_id in range(3):
            critic.load_batch(rollout_id, batch)
            values = critic.compute_values()
            if rollout_id == 0:
                assert all(v == 0.0 for sample in values for v in sample)
            critic.set_column("returns", [[1.0] * n for n in batch.response_lengths])
            losses.append(critic.train()["steps"][0]["train/value_loss"])
        assert losses[2] < losses[0]
    finally:
        critic.shutdown()
