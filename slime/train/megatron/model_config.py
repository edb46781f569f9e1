"""The megatron-core model from the typed `model` and `parallelism` configs.

`transformer_config` maps ModelConfig (HF-style architecture fields) and ParallelismConfig onto
megatron-core's TransformerConfig; `layer_spec` is megatron's local layer spec (standard parameter
names: decoder.layers.N.self_attention.linear_qkv.weight, ...mlp.experts.local_experts.E.linear_fc1.weight)
with the project's packed attention in place of core_attention (which also applies RoPE, from tables
built once per micro-batch: `slime.train.megatron.rope`); `build_model_chunks` builds one GPTModel
per virtual pipeline stage of this rank. Like every module of `slime.train.megatron`, it imports megatron-core at
module level: the package is loaded only when `parallelism.backend=megatron` (through `slime.registry`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer import TransformerConfig, multi_latent_attention
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.transformer_config import MLATransformerConfig

from slime.config.schema import ModelConfig, ParallelismConfig
from slime.models.families import FAMILIES
from slime.train.megatron import rope
from slime.train.megatron.attention import PackedAttention, PackedLatentAttention

ARCHITECTURES = tuple(name for name, family in FAMILIES.items() if family.megatron)


def transformer_config(
    model_cfg: ModelConfig,
    parallelism_cfg: ParallelismConfig,
    *,
    params_dtype: torch.dtype,
    device: str = "cuda",
    extra: dict[str, Any] | None = None,
):
    """megatron-core TransformerConfig for this model and layout; `extra` = parallelism.megatron fields."""
    m, p = model_cfg, parallelism_cfg
    if m.architecture not in ARCHITECTURES:
        raise ValueError(f"model.architecture={m.architecture!r}: expected one of {ARCHITECTURES}")
    kwargs = {
        **_model_fields(m),
        **_layout_fields(p, params_dtype),
        **_kernel_fields(device),
        **_recompute_fields(p),
        **(extra or {}),
    }
    return (MLATransformerConfig if FAMILIES[m.architecture].mla else TransformerConfig)(**kwargs)


def _latent_attention_fields(m: ModelConfig) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention (megatron's `MultiLatentAttention`): the q and kv down-projections
    (none for q without q_lora_rank), their latent RMSNorms (megatron's q/kv_layernorm, built where qk_layernorm
    is set), per-head up-projections into qk_head_dim (no position) + qk_pos_emb_head_dim (rotated) and v_head_dim.
    The layer rotates its own q and k (`rope.latent_rope_fields`)."""
    return dict(
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
        qk_layernorm=True,
        **rope.latent_rope_fields(m),
    )


def _model_fields(m: ModelConfig) -> dict[str, Any]:
    """The architecture (dense, and the MoE router and experts where the model has them)."""
    fields: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        layernorm_epsilon=m.norm_epsilon,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    if m.num_experts is not None:
        fields.update(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size or m.ffn_hidden_size,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            # softmax over the top-k logits == softmax over all, top-k, renormalised (HF norm_topk_prob)
            moe_router_pre_softmax=not m.moe_norm_topk_prob,
            moe_router_score_function="softmax",
            moe_router_dtype="fp32",
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_router_load_balancing_type="aux_loss" if m.moe_aux_loss_coeff else "none",
            moe_grouped_gemm=False,
        )
    if FAMILIES[m.architecture].grouped_moe:
        fields.update(_grouped_router_fields(m))
    if FAMILIES[m.architecture].mla:
        fields.update(_latent_attention_fields(m))
    return fields


def _grouped_router_fields(m: ModelConfig) -> dict[str, Any]:
    """GLM-4.5's router (transformers' `Glm4MoeTopkRouter.forward`): sigmoid scores; the expert-score bias
    (`e_score_correction_bias`, megatron's `expert_bias`) only chooses the experts; the chosen scores renormalised
    (norm_topk_prob; megatron's sigmoid path always does, config_check refuses a model that does not) and scaled by
    routed_scaling_factor. With groups, HF sums each group's top 2 scores where megatron sums its top
    topk/group_topk (`moe_utils.group_limited_topk`): config_check requires they agree. The bias stays the
    checkpoint's (an update rate of 0): the engines route with it, and transformers never updates it. The first
    moe_first_dense_layers layers are dense (HF first_k_dense_replace)."""
    grouped = (m.moe_router_num_groups or 1) > 1
    dense = m.moe_first_dense_layers
    return dict(
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=False,
        moe_router_enable_expert_bias=True,
        moe_router_bias_update_rate=0.0,
        moe_router_topk_scaling_factor=m.moe_routed_scaling_factor,
        moe_router_num_groups=m.moe_router_num_groups if grouped else None,
        moe_router_group_topk=m.moe_router_group_topk if grouped else None,
        moe_layer_freq=[0] * dense + [1] * (m.num_layers - dense),
    )


def _layout_fields(p: ParallelismConfig, params_dtype: torch.dtype) -> dict[str, Any]:
    """Parallel sizes, dtypes, and how micro-batches and losses cross them."""
    return dict(
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp,
        num_layers_in_first_pipeline_stage=p.pp_first_stage_layers,
        num_layers_in_last_pipeline_stage=p.pp_last_stage_layers,
        context_parallel_size=p.cp,
        expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.etp,
        sequence_parallel=p.sequence_parallel and p.tp > 1,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        # packed micro-batches differ in length, the pipeline sends shapes first; the interleaved schedule
        # cannot, so with virtual stages every micro-batch is padded to one length instead
        variable_seq_lengths=p.vpp is None,
        moe_token_dispatcher_type="alltoall",  # megatron: the only dispatcher with variable sequence lengths
        calculate_per_token_loss=True,  # losses carry step-level weights: gradients are summed, never averaged
    )


def _kernel_fields(device: str) -> dict[str, Any]:
    """Initialisation and fusions: none that needs Transformer Engine or apex."""
    return dict(
        use_cpu_initialization=device == "cpu",
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        # megatron's SwiGLU autograd function (torch.compile'd, keeps only its input for the backward); its
        # compile on CPU needs a C++ toolchain and takes seconds, so CUDA only
        bias_activation_fusion=device == "cuda",
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        deallocate_pipeline_outputs=device == "cuda",
    )


def _recompute_fields(p: ParallelismConfig) -> dict[str, Any]:
    r = p.recompute
    if r.granularity is None:
        return {}
    if r.granularity == "full":
        return {
            "recompute_granularity": "full",
            "recompute_method": r.method or "uniform",
            "recompute_num_layers": r.num_layers or 1,
        }
    if r.granularity == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(r.modules or ["core_attn"])}
    raise ValueError(f"parallelism.recompute.granularity={r.granularity!r}: expected full, selective or null")


def layer_spec(config, vp_stage: int | None = None):
    """The block spec of this stage's layers from megatron's local layer specs (SequentialMLP experts; dense and
    MoE layers where `moe_layer_freq` is a list; latent attention where the config has it), with `PackedAttention`
    as core attention (`PackedLatentAttention` behind latent attention, which rotates q and k itself) and every
    norm a `TorchRMSNorm`."""
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=vp_stage)
    core = PackedLatentAttention if config.multi_latent_attention else PackedAttention
    for spec in {id(spec): spec for spec in block.layer_specs}.values():  # one per kind of layer (dense, MoE)
        layer = spec.submodules
        layer.input_layernorm = layer.pre_mlp_layernorm = TorchRMSNorm
        attention = layer.self_attention.submodules
        attention.core_attention = core
        for norm in ("q_layernorm", "k_layernorm", "kv_layernorm"):
            if getattr(attention, norm, IdentityOp) is not IdentityOp:
                setattr(attention, norm, TorchRMSNorm)
        if config.multi_latent_attention:
            attention.linear_q_down_proj = attention.linear_kv_down_proj = _duplicated_linear()
    block.layer_norm = TorchRMSNorm
    return block


def _duplicated_linear() -> type:
    """Latent attention's q/kv down-projections as megatron's duplicated `Linear` (whole weight on every tp rank, as
    Transformer Engine's spec builds them, `TELinear(parallel_mode="duplicated")`): under sequence parallelism each
    rank projects its own tokens and the shared rotated key is gathered over the sequence, whose backward sums
    every rank's heads' gradient (`MLASelfAttention.get_query_key_value_tensors`); the weights are marked
    `sequence_parallel` for `finalize_model_grads` to sum over tp. The local spec's ColumnParallelLinear instead
    hands each rank's heads' part of that key's gradient only to the rank holding its rows."""
    if multi_latent_attention.Linear is None:  # megatron imports it with its Transformer Engine extension
        raise RuntimeError("megatron-core's latent attention did not import its duplicated Linear")
    return multi_latent_attention.Linear


class TorchRMSNorm:
    """torch's RMSNorm, as megatron's local spec builds it without Transformer Engine or apex (`WrappedTorchNorm`),
    but with sequence parallelism, which WrappedTorchNorm refuses at construction: a norm computes each token alone,
    so each tp rank normalises its own tokens, and the weight is marked `sequence_parallel` for megatron's
    `finalize_model_grads` to sum its gradient over the tp ranks (`_allreduce_non_tensor_model_parallel_grads`),
    as it does for Transformer Engine's norms."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def build_model_chunks(model_cfg: ModelConfig, config, *, head: str = "lm") -> list[torch.nn.Module]:
    """This rank's GPTModel chunks (one per virtual pipeline stage), on the current device.

    head="lm": the output layer returns the final hidden states ([b, s, h]); log-probs are computed
    from them vocab-parallel (`slime.train.megatron.logprobs`). head="value": a [1, hidden] value head
    (`output_layer.weight`), the critic's.
    """
    if config.num_moe_experts:
        _moe_without_te()
    if config.multi_latent_attention:
        _latent_attention_without_te()
    if not config.multi_latent_attention:  # (latent attention's RoPE was read into the config: `transformer_config`)
        rope.rope_kwargs(model_cfg)  # a rope_scaling megatron lacks fails here, before anything is built
    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for stage in range(vpp or 1):
        vp_stage = stage if vpp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(config, vp_stage),
            vocab_size=model_cfg.vocab_size,
            max_sequence_length=model_cfg.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            parallel_output=True,
            share_embeddings_and_output_weights=model_cfg.tie_word_embeddings and head == "lm",
            position_embedding_type="none",  # RoPE: once per micro-batch, applied in PackedAttention
            vp_stage=vp_stage,
        )
        _norms_in_params_dtype(model, config.params_dtype)
        if model.post_process:
            _hidden_output(model, head=head)
        chunks.append(model)
    return chunks


def compile_layers(chunks: list[torch.nn.Module], *, backend: str = "inductor") -> None:
    """torch.compile every transformer layer of these GPTModel chunks in place, dynamic shapes (one graph
    for every packed length). megatron's Python between the kernels (activation-offload contexts, a
    deprecation warning in RowParallelLinear) splits a layer into several graphs; the norms, RoPE, SwiGLU
    and residual adds inside each still fuse. Before DDP wraps the chunks (its hooks sit on parameters)."""
    for chunk in chunks:
        for layer in chunk.decoder.layers:
            layer.compile(dynamic=True, backend=backend)


def _norms_in_params_dtype(model, dtype: torch.dtype) -> None:
    """The local spec's torch norms are created in fp32 whatever params_dtype is (megatron's Float16Module
    would cast them). A bf16 input with an fp32 weight misses torch's fused RMSNorm kernel: the composite
    path upcasts the [t, h] input and keeps several fp32 intermediates per norm for the backward (four
    norms per Qwen3 layer). The optimizer keeps fp32 main copies of them like of every bf16 parameter."""
    for module in model.modules():
        if isinstance(module, (torch.nn.RMSNorm, torch.nn.LayerNorm)):
            module.to(dtype)


def _moe_without_te() -> None:
    """megatron-core 0.16's MoE router reads `moe_utils.te_general_gemm`, which is only defined when
    Transformer Engine imports; without TE it must be None (the plain matmul path)."""
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _latent_attention_without_te() -> None:
    """megatron-core 0.16's `multi_latent_attention` imports megatron's Transformer Engine extension, which without
    TE defines its layer classes over a MagicMock and imports fine: the module's HAVE_TE is then True and its
    `isinstance(self.linear_proj, TELinear)` raises. Without TE it must be False."""
    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


def _hidden_output(model, *, head: str) -> None:
    """Make the output layer hand back hidden states (sequence-parallel gathered); a value head swaps
    the vocab-sized weight for one output row."""
    layer = model.output_layer
    if head == "value":
        layer.weight = torch.nn.Parameter(torch.zeros(1, model.config.hidden_size, dtype=layer.weight.dtype))
        layer.weight.allreduce = True  # replicated over tp: DDP reduces it like any dense parameter

    def forward(hidden, weight=None, runtime_gather_output=None):
        if layer.sequence_parallel:
            # the backward takes this rank's tokens of the gradient, which is already whole on every rank: the
            # vocab-parallel log-probs sum it over the tp ranks (`logprobs.copy_to_tensor_model_parallel_region`)
            # and a value head's is the same on each; a reduce-scatter here would sum it tp times
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return hidden, None

    layer.forward = forward


def lm_head_weight(model) -> torch.Tensor:
    """The vocab-parallel LM head weight [V/tp, h] of a post-process chunk (the embedding when tied)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight
