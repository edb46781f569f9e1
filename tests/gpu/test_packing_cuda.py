"""GPU tier: packed forwards on CUDA (torch's varlen FlashAttention under bf16, FSDP2's unsharded LM head
inside the forward) against unpacked per-sample forwards. Needs only torch and transformers."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from slime.algo.logprobs import log_probs_and_entropy
from slime.train import packing

pytestmark = pytest.mark.gpu

SAMPLES = [([5, 9, 17, 3, 40, 41, 42], 3), ([7, 8, 9, 10], 1), ([60, 61, 62, 63, 64, 65, 66, 67, 68], 5), ([11, 12], 1)]


def _models():
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    packed = AutoModelForCausalLM.from_config(config, attn_implementation=packing.register(), dtype=torch.float32)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    reference.load_state_dict(packed.state_dict())
    return packed.cuda().eval(), reference.cuda().eval()


def _unpacked(model, samples):
    lps, ents = [], []
    for tokens, response in samples:
        logits = model(input_ids=torch.tensor([tokens], device="cuda"), use_cache=False).logits[0]
        prompt = len(tokens) - response
        lp, ent = log_probs_and_entropy(
            logits[prompt - 1 : len(tokens) - 1].float(),
            torch.tensor(tokens[prompt:], device="cuda"),
            temperature=0.9,
            with_entropy=True,
        )
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def _packed(model, samples):
    p = packing.pack([t for t, _ in samples], [r for _, r in samples], torch.device("cuda"))
    return packing.log_probs_and_entropy(model, p, temperature=0.9, with_entropy=True, chunk_size=3)


def _grads(model):
    return {
        n.removeprefix("_orig_mod."): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def test_packed_fp32_and_bf16_varlen_match_unpacked_on_cuda():
    packed, reference = _models()
    lp, ent = _packed(packed, SAMPLES)  # fp32: per-sample SDPA
    ref_lp, ref_ent = _unpacked(reference, SAMPLES)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # bf16: varlen FlashAttention when torch has it
        lp16, _ = _packed(packed, SAMPLES)
        ref16, _ = _unpacked(reference, SAMPLES)
        changed = [list(s) for s in SAMPLES]
        changed[2] = ([(t + 5) % 120 for t in SAMPLES[2][0]], SAMPLES[2][1])
        lp16_changed, _ = _packed(packed, changed)
    print("varlen kernel:", packing._varlen_kernel()[0] is not None)
    torch.testing.assert_close(lp16, ref16, rtol=0, atol=5e-2)
    spans = packing.pack([t for t, _ in SAMPLES], [r for _, r in SAMPLES], torch.device("cpu")).rows.numel()
    starts = [0, 3, 4, 9, 10]
    assert starts[-1] == spans
    for i in range(4):  # no sample attends to another: the others stay bit-identical
        same = torch.equal(lp16[starts[i] : starts[i + 1]], lp16_changed[starts[i] : starts[i + 1]])
        assert same == (i != 2), i


def test_fsdp2_packed_gradients_match_unpacked():
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=0, world_size=1)
    packed, reference = _models()
    for layer in packed.model.layers:
        fully_shard(layer)
    fully_shard(packed)
    coef = torch.linspace(-1, 1, 10, device="cuda")
    lp, ent = _packed(packed, SAMPLES)
    ((lp * coef).sum() + 0.3 * ent.sum()).backward()
    ref_lp, ref_ent = _unpacked(reference, SAMPLES)
    ((ref_lp * coef).sum() + 0.3 * ref_ent.sum()).backward()
    got, want = _grads(packed), _grads(reference)
    assert got.keys() == want.keys() and got
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=0, atol=1e-4, msg=name)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp16, ent16 = _packed(packed, SAMPLES)
        ((lp16 * coef).sum() + 0.3 * ent16.sum()).backward()
    assert torch.isfinite(lp16).all() and all(torch.isfinite(g).all() for g in _grads(packed).values())
    dist.destroy_process_group()
