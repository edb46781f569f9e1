"""Model FLOPs of a decoder-only transformer (docs/architecture.md#model-flops): what MFU counts, for the run's
`perf/*` metrics, the dry-run plan and tools/bench_train.py alike. Pure arithmetic on `ModelConfig`; no torch.

Forward FLOPs of one token of a sequence of S tokens, every matmul at 2 FLOPs per multiply-add:
    layers  L·(2·(H·Q + 2·H·KV + Q·H) + 6·H·F + 2·Q·S)   (q, k, v, o projections; SwiGLU's three matrices over the
            active FFN width F; causal attention's scores and values over S/2 keys on average). MLA counts its latent
            projections and its heads' q/k and v widths, MoE models their dense layers' F apart
            (slime.models.shape)
    head    2·H·V, on the tokens the LM head is computed for (our backends: the response tokens only)
Training is 3x the forward (the backward computes gradients of both inputs and weights). With LoRA (`model.lora`)
the base weights are frozen: their matmuls get no weight gradient and count twice (forward and input gradient), while
attention's score and value products and the adapters' own matmuls (2 FLOPs per adapter parameter) count thrice.
"""

from __future__ import annotations

from collections.abc import Iterable

from slime.models.shape import (
    attention_weights,
    dense_layer_count,
    moe_active_width,
    moe_layer_count,
    qk_head_width,
    v_head_width,
)

TRAIN_PASSES = 3.0  # forward + backward (2x the forward)
FROZEN_PASSES = 2.0  # forward + the input gradient of a frozen weight's matmul


def active_ffn_width(model) -> int:
    """FFN width one token passes through in a layer: the dense FFN, or (an MoE layer) top-k routed experts plus the
    shared ones."""
    return model.ffn_hidden_size if model.num_experts is None else moe_active_width(model)


def layer_flops_per_token(model, seq_len: int) -> float:
    """Forward FLOPs of every decoder layer for one token of a sequence of `seq_len` tokens: attention's
    projections, and the FFN of each dense and each MoE layer (slime.models.shape)."""
    h = model.hidden_size
    ffn = dense_layer_count(model) * model.ffn_hidden_size
    ffn += moe_layer_count(model) * moe_active_width(model) if model.num_experts is not None else 0
    per_token = model.num_layers * 2 * attention_weights(model) + 6 * h * ffn
    return float(per_token) + attention_flops_per_token(model, seq_len)


def attention_flops_per_token(model, seq_len: int) -> float:
    """Forward FLOPs of every layer's score and value products for one token of a `seq_len`-token sequence (causal:
    S/2 keys on average), the part of a layer with no weights."""
    widths = qk_head_width(model) + v_head_width(model)
    return float(model.num_layers * model.num_attention_heads * widths * seq_len)


def head_flops_per_token(model) -> float:
    """Forward FLOPs of the LM head for one token."""
    return float(2 * model.hidden_size * model.vocab_size)


def forward_flops(model, sequences: Iterable[tuple[int, int]]) -> float:
    """Forward FLOPs of sequences given as (tokens, tokens the LM head is computed for)."""
    head = head_flops_per_token(model)
    return sum(n * layer_flops_per_token(model, n) + head_tokens * head for n, head_tokens in sequences)


def train_flops(model, sequences: list[tuple[int, int]]) -> float:
    """Training FLOPs (forward and backward) of sequences given as (tokens, tokens the LM head is computed for)."""
    forward = forward_flops(model, sequences)
    lora = model.lora
    if not lora.enabled:
        return TRAIN_PASSES * forward
    attention = sum(n * attention_flops_per_token(model, n) for n, _ in sequences)
    adapters = 2 * lora.adapter_parameter_count(model) * sum(n for n, _ in sequences)
    return FROZEN_PASSES * (forward - attention) + TRAIN_PASSES * (attention + adapters)
