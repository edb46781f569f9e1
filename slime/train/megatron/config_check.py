"""Validation of the megatron backend's config, run before anything starts: the checks of its registry record
(slime.registry.TRAIN_BACKENDS), which slime/plan/validate.py runs.

- `parallelism.megatron.*`: extra megatron-core config fields, checked against megatron-core's own config
  dataclasses where it is importable (an unknown key is an error naming the nearest valid names), never
  a field the typed config owns.
- The backend's rules: sequence parallelism and recompute options, virtual pipeline stages.

No torch or megatron at import: megatron-core is imported only to read its dataclass fields.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any, Optional

from slime.config.problems import Problem, did_you_mean
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig
from slime.models.families import FAMILIES
from slime.train.layout import pipeline_stage_layers

# The megatron-core dataclasses whose fields parallelism.megatron may set (module, class).
MEGATRON_CONFIG_CLASSES = (
    ("megatron.core.model_parallel_config", "ModelParallelConfig"),
    ("megatron.core.transformer.transformer_config", "TransformerConfig"),
    ("megatron.core.transformer.transformer_config", "MLATransformerConfig"),
    ("megatron.core.optimizer.optimizer_config", "OptimizerConfig"),
    ("megatron.core.distributed.distributed_data_parallel_config", "DistributedDataParallelConfig"),
)


def megatron_config_fields() -> Optional[dict[str, str]]:
    """Field name -> the megatron-core class declaring it; None when megatron-core is not importable."""
    fields: dict[str, str] = {}
    for module_name, class_name in MEGATRON_CONFIG_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # not installed, or installed without what it imports (torch extensions): unusable
            return None
        cls = getattr(module, class_name, None)
        if cls is None:  # a class this megatron-core version does not have
            continue
        for f in dataclasses.fields(cls):
            fields.setdefault(f.name, class_name)
    return fields


# the layers of the outer pipeline stages, where they differ from the others'
UNEVEN_STAGE_KEYS = ("pp_first_stage_layers", "pp_last_stage_layers")

# megatron-core fields the typed config decides -> the config key that sets them.
MEGATRON_OWNED = {
    "tensor_model_parallel_size": "parallelism.tp",
    "pipeline_model_parallel_size": "parallelism.pp",
    "num_layers_in_first_pipeline_stage": "parallelism.pp_first_stage_layers",
    "num_layers_in_last_pipeline_stage": "parallelism.pp_last_stage_layers",
    "context_parallel_size": "parallelism.cp",
    "expert_model_parallel_size": "parallelism.ep",
    "expert_tensor_parallel_size": "parallelism.etp",
    "sequence_parallel": "parallelism.sequence_parallel",
    "num_layers": "model.num_layers",
    "hidden_size": "model.hidden_size",
    "ffn_hidden_size": "model.ffn_hidden_size",
    "num_attention_heads": "model.num_attention_heads",
    "num_query_groups": "model.num_query_groups",
    "kv_channels": "model.kv_channels",
    "layernorm_epsilon": "model.norm_epsilon",
    "bf16": "train.precision",
    "fp16": "train.precision",
    "params_dtype": "train.precision",
    "lr": "train.lr",
    "min_lr": "train.min_lr",
    "weight_decay": "train.weight_decay",
    "adam_beta1": "train.adam_beta1",
    "adam_beta2": "train.adam_beta2",
    "adam_eps": "train.adam_eps",
    "clip_grad": "train.clip_grad",
}


def megatron_problems(extra: dict[str, Any], fields: dict[str, str]) -> Iterator[Problem]:
    """Problems of `parallelism.megatron` keys against `fields` (field name -> the class declaring it)."""
    for name, value in extra.items():
        key = f"parallelism.megatron.{name}"
        if name in MEGATRON_OWNED:
            yield Problem(
                key,
                value,
                f"megatron-core's {name} is set from {MEGATRON_OWNED[name]}",
                f"remove {key}; set {MEGATRON_OWNED[name]} instead",
            )
        elif name not in fields:
            yield Problem(
                key,
                value,
                f"not a field of megatron-core's {', '.join(sorted(set(fields.values())))}{did_you_mean(name, fields)}",
                f"remove {key} or use a megatron-core config field name",
            )


def check(cfg: RunConfig) -> Iterator[Problem]:
    """The megatron backend is chosen: parallelism.megatron against megatron-core, the model family, the options."""
    p = cfg.parallelism
    if p.megatron:
        fields = megatron_config_fields()
        if fields is None:
            yield Problem(
                "parallelism.megatron",
                dict(p.megatron),
                "megatron-core is not importable, so these keys cannot be checked (nor trained with)",
                "pip install megatron-core",
            )
        else:
            yield from megatron_problems(dict(p.megatron), fields)
    family = FAMILIES.get(cfg.model.architecture)
    if family is not None and not family.megatron:
        yield Problem(
            "model.architecture",
            cfg.model.architecture,
            f"has no megatron-core layer spec here ({family.no_megatron})",
            "train it with parallelism=fsdp",
        )
    if cfg.model.lora.enabled:
        yield Problem(
            "model.lora.rank",
            cfg.model.lora.rank,
            "the megatron backend trains no LoRA adapters yet (the fsdp backend does)",
            "set parallelism=fsdp, or model.lora.rank=0",
        )
    if cfg.train.on_nonfinite == "skip":
        yield Problem(
            "train.on_nonfinite",
            "skip",
            "megatron-core's optimizer applies a step before its gradient norm is known here, so a non-finite step "
            "cannot be skipped (the run stops on it)",
            "set train.on_nonfinite=stop, or parallelism=fsdp",
        )
    yield from check_backend_options(cfg)


def check_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """Another backend is chosen: megatron-core fields and megatron backend options would be ignored."""
    p = cfg.parallelism
    if p.megatron:
        yield Problem(
            "parallelism.megatron",
            dict(p.megatron),
            f"megatron-core fields do nothing with the {p.backend} backend",
            "remove them or set parallelism.backend=megatron",
        )
        fields = megatron_config_fields()
        if fields is not None:
            yield from megatron_problems(dict(p.megatron), fields)
    for key, value in (
        ("vpp", p.vpp),
        *((key, getattr(p, key)) for key in UNEVEN_STAGE_KEYS),
        ("recompute.granularity", p.recompute.granularity),
        ("compile_layers", p.compile_layers or None),
    ):
        if value is not None:
            yield Problem(
                f"parallelism.{key}",
                value,
                f"a megatron backend option; the {p.backend} backend would ignore it",
                f"remove parallelism.{key} or set parallelism.backend=megatron",
            )


def check_backend_options(cfg: RunConfig) -> Iterator[Problem]:
    """The megatron backend's parallelism options against the model and the device."""
    p, m = cfg.parallelism, cfg.model
    family = FAMILIES.get(m.architecture)
    if p.sequence_parallel and p.tp == 1:
        yield Problem(
            "parallelism.sequence_parallel",
            True,
            "sequence parallelism splits over tp ranks, and tp=1",
            "set parallelism.tp > 1 or sequence_parallel=false",
        )
    if p.tp > 1 and m.vocab_size % p.tp:
        yield Problem(
            "parallelism.tp",
            p.tp,
            f"the megatron backend splits model.vocab_size={m.vocab_size} evenly over the tp ranks",
            f"pick a parallelism.tp dividing {m.vocab_size}",
        )
    if p.fp8:
        yield _fp8_problem()
    yield from _check_tensor_parallel_splits(p, m, family)
    yield from _check_pipeline_stages(cfg)
    yield from _check_recompute(cfg)
    if family is not None and family.grouped_moe:
        yield from _check_grouped_router(m)


def _fp8_problem() -> Problem:
    """megatron-core trains in FP8 only through Transformer Engine's layers; this backend builds megatron-core's
    local ones (`model_config.layer_spec`)."""
    if importlib.util.find_spec("transformer_engine") is None:
        why = "megatron-core trains in FP8 through Transformer Engine, which is not installed"
    else:
        why = "megatron-core trains in FP8 through Transformer Engine's layers; this backend builds its local ones"
    return Problem(
        "parallelism.fp8", True, why, "set parallelism.fp8=false, or use parallelism=fsdp (torchao's float8)"
    )


LATENT_ATTENTION = "latent attention (model.architecture=deepseek_v3)"


def _check_tensor_parallel_splits(p, m, family) -> Iterator[Problem]:
    """What megatron-core splits over tp ranks only with sequence parallelism (MoE layers; latent attention, whose
    shared rotated key is whole on every rank, `model_config._duplicated_linear`: only the sequence gather's backward
    sums its gradient over every rank's heads, and without it `finalize_model_grads` would sum the whole latent
    q-norm gradient over tp again, by name), how experts split with ep=1, and latent attention's refused cp."""
    has_moe_layers = m.num_experts is not None and m.moe_first_dense_layers < m.num_layers
    latent = family is not None and family.mla
    needs = [what for what, needed in (("MoE layers", has_moe_layers), (LATENT_ATTENTION, latent)) if needed]
    if needs and p.tp > 1 and not p.sequence_parallel:
        yield Problem(
            "parallelism.tp",
            p.tp,
            f"megatron-core splits {' and '.join(needs)} over tp ranks only together with sequence parallelism",
            "set parallelism.sequence_parallel=true, or parallelism.tp=1 (experts split with parallelism.ep instead)",
        )
    if has_moe_layers and p.ep == 1 and p.tp > 1 and p.etp != p.tp:
        # megatron marks experts `allreduce` without expert parallelism (ColumnParallelLinear: `not (is_expert and
        # expert_parallel)`) and its DDP then sums their gradients over the data-parallel ranks only: experts whole
        # on every tp rank, each computing its own sequence-parallel tokens, would each learn from those alone
        yield Problem(
            "parallelism.etp",
            p.etp,
            f"with parallelism.ep=1 megatron-core sums the experts' gradients over the data-parallel ranks only, so "
            f"they must split over the tp={p.tp} ranks as megatron's default does (etp = tp)",
            f"set parallelism.etp={p.tp}, or parallelism.ep > 1",
        )
    if latent and p.cp > 1:
        yield Problem(
            "parallelism.cp",
            p.cp,
            f"{LATENT_ATTENTION} rotates its own q and k, which this backend's zigzag context-parallel split of "
            "packed samples does not give it",
            "set parallelism.cp=1",
        )


def _check_grouped_router(m) -> Iterator[Problem]:
    """What megatron-core's sigmoid router computes as transformers' Glm4MoeTopkRouter does (model_config's
    `_grouped_router_fields`): renormalised top-k scores, and groups ranked by their top 2 scores."""
    if not m.moe_norm_topk_prob and m.moe_router_topk > 1:
        yield Problem(
            "model.moe_norm_topk_prob",
            False,
            "megatron-core's sigmoid router always renormalises the chosen experts' scores",
            "train this model with parallelism=fsdp",
        )
    groups, chosen = m.moe_router_num_groups or 1, m.moe_router_group_topk or 1
    if groups > 1 and m.moe_router_topk != 2 * chosen:
        yield Problem(
            "model.moe_router_group_topk",
            chosen,
            f"megatron-core ranks a group by its top moe_router_topk/group_topk={m.moe_router_topk // chosen} scores, "
            "transformers by its top 2: they agree only when moe_router_topk = 2 x moe_router_group_topk",
            "train this model with parallelism=fsdp",
        )


def _check_pipeline_stages(cfg: RunConfig) -> Iterator[Problem]:
    """The layers split into pp (x vpp virtual) equal stages, or pp stages of which the first and last hold
    `pp_first_stage_layers` / `pp_last_stage_layers` and the others the rest equally."""
    p, m = cfg.parallelism, cfg.model
    uneven = {k: v for k in UNEVEN_STAGE_KEYS if (v := getattr(p, k)) is not None}
    if uneven and (p.pp < 2 or p.vpp is not None):
        key = next(iter(uneven))
        yield Problem(
            f"parallelism.{key}",
            uneven[key],
            f"sets the layers of an outer pipeline stage, for pp >= 2 without virtual stages (pp={p.pp}, vpp={p.vpp})",
            f"remove parallelism.{key}, or set parallelism.pp >= 2 and parallelism.vpp=null",
        )
        return
    if p.vpp is not None:
        yield from _check_virtual_stages(cfg)
    elif p.pp > 1:
        first, last = p.pp_first_stage_layers, p.pp_last_stage_layers
        try:
            pipeline_stage_layers(m.num_layers, p.pp, first=first, last=last)
        except ValueError as error:
            key = next(iter(uneven), "pp")
            yield Problem(
                f"parallelism.{key}",
                getattr(p, key),
                f"model.num_layers={m.num_layers}: {error}",
                "pick a pp dividing model.num_layers, or set parallelism.pp_first_stage_layers and/or "
                "pp_last_stage_layers so that the other stages share the rest equally",
            )


def _check_virtual_stages(cfg: RunConfig) -> Iterator[Problem]:
    p, m = cfg.parallelism, cfg.model
    if p.pp < 2 or p.vpp < 2:
        yield Problem(
            "parallelism.vpp",
            p.vpp,
            f"virtual pipeline stages need pp >= 2 and vpp >= 2 (pp={p.pp})",
            "set parallelism.vpp=null or raise parallelism.pp",
        )
    elif p.pp == 2 and cfg.cluster.device == "cpu":
        yield Problem(
            "parallelism.vpp",
            p.vpp,
            "with pp=2 both pipeline neighbours are one gloo peer, and the interleaved schedule's batched"
            " sends in both directions pair up wrongly on CPU (measured: wrong gradients)",
            "use pp >= 4 with vpp on CPU, or parallelism.vpp=null",
        )
    elif m.num_layers % (p.pp * p.vpp):
        yield Problem(
            "parallelism.vpp",
            p.vpp,
            f"model.num_layers={m.num_layers} does not split into pp·vpp={p.pp * p.vpp} equal stages",
            "pick pp and vpp whose product divides model.num_layers",
        )


# megatron-core's selective recompute modules that run on the local spec without Transformer Engine:
# "layernorm" and "moe_act" use CheckpointWithoutOutput, which reads TE's FP8GlobalStateManager in 0.16.1
SELECTIVE_MODULES = ("core_attn", "mlp", "moe", "shared_experts")


def _check_recompute(cfg: RunConfig) -> Iterator[Problem]:
    r = cfg.parallelism.recompute
    if r.granularity not in (None, "full", "selective"):
        yield Problem(
            "parallelism.recompute.granularity",
            r.granularity,
            "expected full, selective or null",
            "set it to full or selective, or remove it",
        )
    if r.method not in (None, "uniform", "block"):
        yield Problem(
            "parallelism.recompute.method",
            r.method,
            "expected uniform or block",
            "set parallelism.recompute.method=uniform",
        )
    if r.granularity != "full" and (r.method is not None or r.num_layers is not None):
        yield Problem(
            "parallelism.recompute",
            {"method": r.method, "num_layers": r.num_layers},
            "method and num_layers apply to granularity=full only",
            "set parallelism.recompute.granularity=full or remove them",
        )
    unusable = sorted(set(r.modules or ()) - set(SELECTIVE_MODULES))
    if r.granularity == "selective" and unusable:
        yield Problem(
            "parallelism.recompute.modules",
            r.modules,
            f"{unusable} cannot be recomputed by this backend: {SELECTIVE_MODULES} can ('layernorm' and 'moe_act'"
            " need Transformer Engine in megatron-core 0.16, 'mla_up_proj' multi-latent attention)",
            f"keep parallelism.recompute.modules within {SELECTIVE_MODULES}",
        )
    if r.granularity != "selective" and r.modules is not None:
        yield Problem(
            "parallelism.recompute.modules",
            r.modules,
            "modules apply to granularity=selective only",
            "set parallelism.recompute.granularity=selective or remove them",
        )
    replays = RoutingReplay.named(cfg.algo.routing_replay) not in (None, RoutingReplay.NONE)
    if r.granularity == "full" and cfg.parallelism.pp > 1 and replays:
        yield Problem(
            "parallelism.recompute.granularity",
            r.granularity,
            "full recompute runs each MoE router again in the backward, and with pipeline stages (pp > 1) a "
            "micro-batch's backward comes after later micro-batches' forwards: it would replay their routes",
            "set parallelism.recompute.granularity=selective (or null), or parallelism.pp=1, with algo.routing_replay",
        )
