"""What the megatron model does per layer, on one CPU rank in bf16: no host reads of device values, parameters
in the compute dtype, and RoPE from the micro-batch's tables equal to megatron's own THD RoPE; and the fused
AdamW the CUDA runs switch to steps under megatron's optimizer."""

from __future__ import annotations

import random

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("megatron.core")

from slime.config.schema import ModelConfig  # noqa: E402
from slime.train.megatron import batch as mbatch  # noqa: E402
from slime.train.megatron import rope, standalone  # noqa: E402
from slime.train.megatron.optimizer import fused_adam  # noqa: E402
from tests.conftest import model_fields  # noqa: E402

# Tensor -> Python conversions: on CUDA each one waits for every queued kernel
HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__}
HOST_READS |= {torch.Tensor.__float__, torch.Tensor.__index__}


class CountHostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_hot_path_host_reads_dtypes_rope_and_fused_adam(tiny_model_dir):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd
    from megatron.core.packed_seq_params import PackedSeqParams

    model_cfg = ModelConfig(**{**model_fields("tiny_qwen3"), "hf_checkpoint": tiny_model_dir})
    backend = standalone.build(model_cfg, device="cpu", precision="bf16", max_tokens_per_gpu=64)
    try:
        chunk = backend.model[0].module
        # the local spec's torch norms are built in fp32; an fp32 weight keeps torch off its fused RMSNorm
        assert {p.dtype for p in chunk.parameters()} == {torch.bfloat16}
        rng = random.Random(3)
        samples = [[rng.randrange(1, model_cfg.vocab_size) for _ in range(rng.randint(3, 12))] for _ in range(4)]
        packed = mbatch.build(samples, [2] * len(samples))
        params = packed.packed_seq_params(rotary=backend.rotary, dtype=torch.bfloat16)
        counter = CountHostReads()
        with torch.no_grad(), counter:
            hidden = chunk(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                attention_mask=None,
                packed_seq_params=params,
            )
        assert counter.calls == [], f"host reads in the forward: {counter.calls}"
        assert hidden.shape == (1, packed.input_ids.shape[1], model_cfg.hidden_size)

        q = torch.randn(packed.input_ids.shape[1], 4, model_cfg.kv_channels, dtype=torch.bfloat16)
        theirs = _apply_rotary_pos_emb_thd(
            q,
            packed.cu_seqlens,
            backend.rotary(packed.max_seqlen, packed_seq=True),
            cp_group=backend.cp_group,
        )
        ours = rope.apply(q, params.rope_cos, params.rope_sin, interleaved=False)
        assert torch.equal(ours, theirs)
        assert isinstance(params, PackedSeqParams)

        # torch's fused AdamW under megatron's (chained, distributed) optimizer, as on CUDA
        fused_adam(backend.optimizer)
        before = standalone.forward_log_probs(backend, [(s, [1, 1]) for s in samples]).clone()
        step = standalone.train_step(backend, [(s, [1, 1]) for s in samples])
        after = standalone.forward_log_probs(backend, [(s, [1, 1]) for s in samples])
        inner = backend.optimizer.chained_optimizers[0].optimizer
        assert all(g["fused"] and not g["foreach"] for g in inner.param_groups)
        assert {state["step"].item() for state in inner.state.values()} == {1.0}
        assert step["train/grad_norm"] > 0 and not torch.equal(before, after)
    finally:
        backend.shutdown()
