"""What the megatron model does per layer, on one CPU rank in bf16: no host reads of device values, parameters
in the compute dtype, and RoPE from the micro-batch's tables equal to megatron's own THD RoPE; the fused
AdamW the CUDA runs switch to steps under megatron's optimizer; and the foreach multi-tensor ops that replace
megatron's per-tensor fallbacks on CUDA give the fallbacks' gradient norm and clipped step."""

from __future__ import annotations

import random

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("megatron.core")

from slime.config.schema import ModelConfig  # noqa: E402
from slime.train.megatron import batch as mbatch  # noqa: E402
from slime.train.megatron import multi_tensor, rope  # noqa: E402
from slime.train.megatron.optimizer import fused_adam  # noqa: E402
from tests.helpers import megatron_standalone as standalone  # noqa: E402
from tests.helpers.compose import model_fields  # noqa: E402

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


def test_foreach_multi_tensor_ops_match_megatron_fallbacks(tiny_model_dir, monkeypatch):
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    flag = torch.zeros(1, dtype=torch.int)
    tensors = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2)]
    norm, per_tensor = multi_tensor.l2_norm(0, flag, [tensors[:2], tensors[2:]], False)
    expected = torch.linalg.vector_norm(torch.cat([t.flatten() for t in tensors]))
    assert per_tensor is None and norm.shape == (1,) and norm.dtype == torch.float32
    assert torch.allclose(norm[0], expected, rtol=1e-6)
    halves = [torch.empty_like(t, dtype=torch.bfloat16) for t in tensors]
    multi_tensor.scale(0, flag, [tensors, halves], 0.5)  # scaled copies, cast like copy_
    assert all(torch.equal(h, (t * 0.5).to(torch.bfloat16)) for h, t in zip(halves, tensors))
    in_place = [t.clone() for t in tensors]
    multi_tensor.scale(0, flag, [in_place, in_place], 0.25)
    assert all(torch.equal(a, t * 0.25) for a, t in zip(in_place, tensors))

    def clipped_step():
        """grad norm of one step clipped at train.clip_grad = 1 (the tiny model's is ~11), and log-probs after"""
        backend = standalone.build(model_cfg, device="cpu", precision="fp32", max_tokens_per_gpu=64)
        try:
            step = standalone.train_step(backend, samples)
            return step["train/grad_norm"], standalone.forward_log_probs(backend, samples)
        finally:
            backend.shutdown()

    model_cfg = ModelConfig(**{**model_fields("tiny_qwen3"), "hf_checkpoint": tiny_model_dir})
    rng = random.Random(5)
    samples = [([rng.randrange(1, model_cfg.vocab_size) for _ in range(rng.randint(4, 12))], [1, 1]) for _ in range(4)]
    for module in (clip_grads, optimizer):
        monkeypatch.setattr(module, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    theirs = clipped_step()
    multi_tensor.activate("cpu")  # CPU runs keep megatron's own fallbacks
    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm
    multi_tensor.activate("cuda")
    assert clip_grads.l2_norm_impl is multi_tensor.l2_norm
    assert clip_grads.multi_tensor_scale_impl is optimizer.multi_tensor_scale_impl is multi_tensor.scale
    ours = clipped_step()
    assert theirs[0] > 2 and ours[0] == pytest.approx(theirs[0], rel=1e-6)
    assert torch.allclose(ours[1], theirs[1], atol=1e-6)

    def real_kernel(*args):  # what Transformer Engine or apex would have bound
        raise AssertionError("not called")

    monkeypatch.setattr(clip_grads, "l2_norm_impl", real_kernel)
    multi_tensor.activate("cuda")
    assert clip_grads.l2_norm_impl is real_kernel
