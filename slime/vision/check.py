"""What a run with images needs of its other parts, checked before anything starts (exit 2 on a problem).

model.vision            the fsdp backend (megatron's refusal is the family's), an engine that takes images (the
                        built-in one or SGLang), no LoRA adapters, no critic (PPO's value model)
data.multimodal_keys    the image modality only, and only with a vision-language model
train.freeze_vision     a vision-language model's
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.estimators import ESTIMATORS
from slime.config.problems import Problem
from slime.config.schema import RunConfig

IMAGE_ENGINES = ("hf", "sglang")  # the engines whose /generate takes `image_data` (vLLM's token endpoint does not)
MODALITIES = ("image",)


def check_vision_run(cfg: RunConfig) -> Iterator[Problem]:
    keys = dict(cfg.data.multimodal_keys)
    for modality in sorted(set(keys) - set(MODALITIES)):
        yield Problem(
            f"data.multimodal_keys.{modality}",
            keys[modality],
            f"only images are read (modalities: {list(MODALITIES)})",
            f"remove data.multimodal_keys.{modality}",
        )
    vision = cfg.model.vision is not None
    if "image" in keys and not vision:
        yield Problem(
            "data.multimodal_keys.image",
            keys["image"],
            f"model={cfg.model.name} reads no images (a text model)",
            "choose a vision-language model (model=tiny_qwen2_5_vl, qwen2_5_vl_3b) or remove the key",
        )
    if cfg.train.freeze_vision and not vision:
        yield Problem("train.freeze_vision", True, "the model has no vision tower", "set train.freeze_vision=false")
    if vision:
        yield from _check_parts(cfg)


def _check_parts(cfg: RunConfig) -> Iterator[Problem]:
    model = f"model={cfg.model.name} (a vision-language model)"
    if cfg.rollout.engine not in IMAGE_ENGINES:
        yield Problem(
            "rollout.engine",
            cfg.rollout.engine,
            f"{model}: this engine's requests carry no images here",
            f"use rollout={' or rollout='.join(IMAGE_ENGINES)}",
        )
    if cfg.model.lora.enabled:
        yield Problem(
            "model.lora.rank",
            cfg.model.lora.rank,
            f"{model}: adapters would wrap the vision tower's projections too (its MLP shares their names)",
            "set model.lora.rank=0 (full training; train.freeze_vision=true keeps the tower as loaded)",
        )
    estimator = ESTIMATORS.find(cfg.algo.advantage_estimator)
    if estimator is not None and estimator.needs_critic:
        yield Problem(
            "algo.advantage_estimator",
            cfg.algo.advantage_estimator,
            f"{model}: the critic (a token-classification head) is built for text models only",
            "use a critic-free estimator (algo=grpo, rloo, reinforce_plus_plus)",
        )
