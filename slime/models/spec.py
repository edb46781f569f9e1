"""The model families' records (slime.registry): `model.architecture=qwen3|qwen3_moe|...` (HF's `model_type`), each
the transformers class its checkpoints name, its `Family` facts (slime.models.families) and the family's check
(slime.models.check.check_family)."""

from slime.models.check import check_family
from slime.models.families import Family
from slime.registry import Checks, Spec

_VISION_NO_MEGATRON = "a vision-language model: the megatron backend builds text decoders only (use parallelism=fsdp)"
FAMILIES = {  # name (model.architecture, HF's model_type) -> its facts
    "qwen3": Family("Qwen3ForCausalLM", qk_layernorm=True, qkv_bias=None, moe=False),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", qk_layernorm=True, qkv_bias=None, moe=True),
    "qwen2": Family("Qwen2ForCausalLM", qk_layernorm=False, qkv_bias=True, moe=False),
    "llama": Family("LlamaForCausalLM", qk_layernorm=False, qkv_bias=None, moe=False),
    "glm4": Family(
        "Glm4ForCausalLM",
        qk_layernorm=False,
        qkv_bias=None,
        moe=False,
        norms_per_layer=4,
        no_megatron="GLM-4 normalises each attention and MLP output, which megatron-core's TransformerLayer cannot",
    ),
    "glm4_moe": Family(
        "Glm4MoeForCausalLM",
        qk_layernorm=None,
        qkv_bias=None,
        moe=True,
        grouped_moe=True,
    ),
    "qwen2_5_vl": Family(
        "Qwen2_5_VLForConditionalGeneration",
        qk_layernorm=False,
        qkv_bias=True,
        moe=False,
        vision=True,
        no_megatron=_VISION_NO_MEGATRON,
    ),
    "qwen3_vl": Family(
        "Qwen3VLForConditionalGeneration",
        qk_layernorm=True,
        qkv_bias=False,
        moe=False,
        vision=True,
        no_megatron=_VISION_NO_MEGATRON,
    ),
    "deepseek_v3": Family(
        "DeepseekV3ForCausalLM",
        qk_layernorm=False,
        qkv_bias=False,
        moe=True,
        grouped_moe=True,
        mla=True,
    ),
}

SPECS = tuple(
    Spec(
        seam="model.architecture",
        name=name,
        target=f"transformers.{family.hf_class}",
        facts=family,
        checks=Checks(check=check_family),
    )
    for name, family in FAMILIES.items()
)
