"""Rotary position embeddings of a packed micro-batch, computed once per micro-batch instead of per layer.

megatron-core's unfused THD RoPE (`rope_utils._apply_rotary_pos_emb_thd`, no Transformer Engine) runs for
q and for k in every layer: it reads `cu_seqlens` to the host (`.tolist()` and a `cu_seqlens[-1]` compare,
two device syncs each), splits the stream per sample, concatenates the per-sample frequency slices and
takes cos and sin of them in fp32. Here the GPTModel is built without RoPE (`position_embedding_type=
"none"`); the micro-batch's cos/sin tables (Tensor[t, 1, 1, d] in the compute dtype) are gathered once
from megatron's own `RotaryEmbedding` frequencies by each token's position (positions restart per
sample, and under zigzag CP they are the positions the rank holds), and `PackedAttention` applies them to
q and k. The arithmetic is megatron's (`t·cos + rotate_half(t)·sin`, cos/sin rounded to the compute
dtype), so the values are the same as megatron's THD path.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.models.common.embeddings.rope_utils import _rotate_half
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from torch import Tensor

from slime.config.schema import ModelConfig

# HF rope_scaling types megatron-core's RotaryEmbedding implements (Llama-3's frequency scaling)
LLAMA3_ROPE_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_kwargs(m: ModelConfig) -> dict[str, Any]:
    """GPTModel's rotary arguments; HF's Llama-3 rope_scaling maps onto megatron's llama3 scaling."""
    kwargs: dict[str, Any] = {"rotary_base": m.rotary_base, "rotary_percent": m.rotary_percent}
    scaling = m.rope_scaling
    if not scaling:
        return kwargs
    kind = scaling.get("rope_type", scaling.get("type"))
    extra = {k: float(scaling.get(k, v)) for k, v in LLAMA3_ROPE_DEFAULTS.items()}
    if kind != "llama3" or extra != {k: float(v) for k, v in LLAMA3_ROPE_DEFAULTS.items()}:
        raise ValueError(
            f"model.rope_scaling={dict(scaling)}: the megatron backend implements rope_type llama3 with "
            f"{LLAMA3_ROPE_DEFAULTS} only"
        )
    kwargs.update(rope_scaling=True, rope_scaling_factor=float(scaling["factor"]))
    return kwargs


# HF's YaRN keys (DeepSeek-V3's rope_scaling) -> megatron's MLATransformerConfig fields, with HF's defaults
# (transformers' `_compute_yarn_parameters`; `DeepseekV3Attention` scales the softmax by mscale_all_dim's mscale)
YARN_FIELDS = {
    "factor": ("rotary_scaling_factor", None),
    "original_max_position_embeddings": ("original_max_position_embeddings", None),
    "beta_fast": ("beta_fast", 32.0),
    "beta_slow": ("beta_slow", 1.0),
    "mscale": ("mscale", 1.0),
    "mscale_all_dim": ("mscale_all_dim", 0.0),
}


def latent_rope_fields(m: ModelConfig) -> dict[str, Any]:
    """MLATransformerConfig's RoPE of a latent-attention model: plain (`rope`) or YaRN as HF's rope_scaling says.
    megatron rotates the qk_pos_emb_head_dim dimensions DeepSeek's way (pairs interleaved, as HF's
    `rope_interleave`); without scaling the softmax scale is 1/sqrt(qk_head_dim + qk_pos_emb_head_dim)."""
    fields: dict[str, Any] = {"rotary_base": m.rotary_base, "rotary_percent": 1.0}
    scaling = m.rope_scaling
    if not scaling:
        return {**fields, "rope_type": "rope", "rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise ValueError(f"model.rope_scaling={dict(scaling)}: latent attention on megatron takes rope_type yarn only")
    fields["rope_type"] = "yarn"
    for key, (field, default) in YARN_FIELDS.items():
        value = scaling.get(key, default)
        if value is None:
            raise ValueError(f"model.rope_scaling={dict(scaling)}: YaRN needs {key!r}")
        fields[field] = float(value) if field != "original_max_position_embeddings" else int(value)
    return fields


def rotary_embedding(model_cfg: ModelConfig, config):
    """megatron's RotaryEmbedding with the arguments GPTModel would give it (base, percent, llama3 scaling); None
    for latent attention, whose layers rotate q and k themselves (`latent_rope_fields`)."""
    if config.multi_latent_attention:
        return None
    return RotaryEmbedding(
        kv_channels=config.kv_channels,
        rotary_interleaved=config.rotary_interleaved,
        use_cpu_initialization=config.use_cpu_initialization,
        **rope_kwargs(model_cfg),
    )


def tables(rotary, position_ids: Tensor, max_seqlen: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(cos, sin), each Tensor[t, 1, 1, d] in `dtype`, for the tokens at `position_ids` (Tensor[1, t] or [t],
    every entry < max_seqlen); (None, None) without a `rotary` (latent attention)."""
    if rotary is None:
        return None, None
    emb = rotary.get_emb(max_seqlen)  # [max_seqlen, 1, 1, d] fp32
    freqs = emb[position_ids.reshape(-1).to(emb.device)]
    return torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)


def apply(t: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> Tensor:
    """RoPE of t: Tensor[t, heads, head_dim] with the micro-batch's tables (the first d dims rotate)."""
    x = t.unsqueeze(1)  # [t, 1, heads, head_dim], megatron's sbhd layout with b = 1
    rot = cos.shape[-1]
    x, rest = x[..., :rot], x[..., rot:]
    out = x * cos + _rotate_half(x, interleaved) * sin
    if rest.shape[-1]:
        out = torch.cat((out, rest), dim=-1)
    return out.squeeze(1)
