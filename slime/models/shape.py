"""What a `ModelConfig` implies layer by layer: attention (grouped-query, or DeepSeek's multi-head latent attention)
and FFNs (dense layers, and MoE layers of routed experts, a router and shared experts; GLM-4.5 and DeepSeek-V3 keep
their first `moe_first_dense_layers` layers dense). Pure arithmetic, no torch: the dry run's parameter count and
memory estimate (slime.plan.memory) and the model FLOPs (slime.models.flops) read it. Counts are elements (weights),
per layer unless a name says otherwise; transformers' parameters of the same shapes are these exactly (the router's
expert-score bias of GLM-4.5 / DeepSeek-V3 is a buffer there, not a parameter).
"""

from __future__ import annotations

from slime.models.families import FAMILIES


def uses_mla(model) -> bool:
    """Multi-head latent attention (deepseek_v3): k and v through a low-rank latent."""
    return model.kv_lora_rank is not None


def qk_head_width(model) -> int:
    """Width of one head's query and key (MLA: the part without RoPE plus the rotary part)."""
    return model.qk_head_dim + model.qk_pos_emb_head_dim if uses_mla(model) else model.kv_channels


def v_head_width(model) -> int:
    return model.v_head_dim if uses_mla(model) else model.kv_channels


def attention_weights(model) -> int:
    """Weights of one layer's attention projections: each token's matmuls multiply by every one of them.

    GQA: q (H x heads·d), k and v (H x groups·d), o. MLA: q through the q_lora_rank bottleneck (or one projection),
    the latent kv_lora_rank plus the shared rotary key from H, the latent up to each head's key and value, o."""
    h, heads = model.hidden_size, model.num_attention_heads
    if not uses_mla(model):
        q, kv = heads * model.kv_channels, model.num_query_groups * model.kv_channels
        return h * q + 2 * h * kv + q * h
    q_out = heads * qk_head_width(model)
    q = h * q_out if model.q_lora_rank is None else model.q_lora_rank * (h + q_out)
    latent = h * (model.kv_lora_rank + model.qk_pos_emb_head_dim)
    up = model.kv_lora_rank * heads * (model.qk_head_dim + model.v_head_dim)
    return q + latent + up + heads * model.v_head_dim * h


def attention_parameters(model) -> int:
    """`attention_weights` plus what else one layer's attention holds: MLA's two latent norms; GQA's per-head q/k
    norms (qk_layernorm) and q/k/v biases (add_qkv_bias)."""
    n = attention_weights(model)
    if uses_mla(model):
        return n + (model.q_lora_rank or 0) + model.kv_lora_rank
    d = model.kv_channels
    n += 2 * d if model.qk_layernorm else 0
    n += (model.num_attention_heads + 2 * model.num_query_groups) * d if model.add_qkv_bias else 0
    return n


def layer_norm_parameters(model) -> int:
    """The hidden-width RMSNorms of one decoder layer (before attention and MLP; GLM-4 also after each)."""
    return FAMILIES[model.architecture].norms_per_layer * model.hidden_size


def kv_cache_width(model) -> int:
    """Elements one token keeps in one layer's KV cache: k and v of every query group; MLA caches the latent and the
    shared rotary key (what SGLang's and vLLM's MLA backends store)."""
    if uses_mla(model):
        return model.kv_lora_rank + model.qk_pos_emb_head_dim
    return 2 * model.num_query_groups * model.kv_channels


def moe_layer_count(model) -> int:
    """Layers with routed experts (0 for a dense model)."""
    return 0 if model.num_experts is None else model.num_layers - model.moe_first_dense_layers


def dense_layer_count(model) -> int:
    return model.num_layers - moe_layer_count(model)


def routed_expert_weights(model) -> int:
    """Weights of every routed expert of one MoE layer (SwiGLU: three matrices of H x moe_ffn_hidden_size)."""
    return model.num_experts * 3 * model.hidden_size * (model.moe_ffn_hidden_size or model.ffn_hidden_size)


def moe_layer_other_weights(model) -> int:
    """The rest of one MoE layer's FFN: the router (H x experts) and the shared experts (one SwiGLU of their joint
    width, moe_shared_expert_intermediate_size)."""
    shared = model.moe_shared_expert_intermediate_size or 0
    return model.hidden_size * model.num_experts + 3 * model.hidden_size * shared


def moe_active_width(model) -> int:
    """FFN width one token passes through in an MoE layer: its top-k routed experts plus the shared ones."""
    routed = model.moe_router_topk * (model.moe_ffn_hidden_size or model.ffn_hidden_size)
    return routed + (model.moe_shared_expert_intermediate_size or 0)


def vision_parameters(model) -> int:
    """Parameters of a vision-language model's vision tower (`model.vision`; 0 for a text model)."""
    if model.vision is None:
        return 0
    return (_qwen3_vl_tower if model.architecture == "qwen3_vl" else _qwen2_5_vl_tower)(model)


def _qwen2_5_vl_tower(model) -> int:
    """Qwen2.5-VL's: the patch embedding (a bias-free 3-D convolution over in_channels x temporal x patch x patch
    pixels), per block two RMSNorms, fused qkv and the output projection with biases, a SwiGLU MLP with biases, and
    the merger (an RMSNorm, then two biased linears from merge² patches to the language model's hidden_size)."""
    v = model.vision
    h, f = v.hidden_size, v.ffn_hidden_size
    patch = v.in_channels * v.temporal_patch_size * v.patch_size**2 * h
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * f + f) + (f * h + h)
    merged = h * v.spatial_merge_size**2
    merger = h + (merged * merged + merged) + (merged * model.hidden_size + model.hidden_size)
    return patch + v.depth * block + merger


def _qwen3_vl_tower(model) -> int:
    """Qwen3-VL's: the patch embedding (a 3-D convolution with bias) and a learned position table, per block two
    LayerNorms (weight and bias), fused qkv and the output projection with biases, a two-linear GELU MLP with biases;
    the merger (a LayerNorm over one patch, then two biased linears from merge² patches to the language model's
    hidden_size), and one more merger per DeepStack block, whose LayerNorm spans the merge² patches."""
    v = model.vision
    h, f = v.hidden_size, v.ffn_hidden_size
    patch = v.in_channels * v.temporal_patch_size * v.patch_size**2 * h + h
    positions = (v.num_position_embeddings or 0) * h
    block = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    merged = h * v.spatial_merge_size**2
    linears = (merged * merged + merged) + (merged * model.hidden_size + model.hidden_size)
    mergers = (2 * h + linears) + len(v.deepstack_visual_indexes) * (2 * merged + linears)
    return patch + positions + v.depth * block + mergers
