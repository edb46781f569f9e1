"""LoRA on the fsdp backend: peft's adapters injected into the HF model in place (its class and the names of every
other weight stay), the base frozen, the adapters trained in fp32.

Names: a target projection `...q_proj.weight` becomes `...q_proj.base_layer.weight` beside
`...q_proj.lora_A.default.weight` (rank x in) and `...q_proj.lora_B.default.weight` (out x rank). Engines and HF
exports get the merged weights under the base's names: W + B·A·alpha/rank (`merged_weights`); an adapter-only sync
moves the adapter under peft's names and the trained gains under their own (`synced_tensors`). `model.lora.train_params`
(norm gains) train whole. A checkpoint holds what trains alone (`trained_state`): the rest never changes and is the
run's `model.hf_checkpoint`. The reference model of a KL term is that base: the policy with its adapters off
(`base_only`), no second copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from slime.config.schema_lora import LORA_INITS, LoRAConfig

ADAPTER = "default"  # peft's adapter name
BASE = ".base_layer"


def _peft():
    import peft  # ~4 s to import: only runs with adapters load it

    return peft


def peft_config(lora: LoRAConfig, **fields):
    """peft's `LoraConfig` of `lora` (`fields`: more of its fields, e.g. the trained gains' `modules_to_save`)."""
    return _peft().LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        init_lora_weights=LORA_INITS[lora.init],
        **fields,
    )


def apply_lora(model: nn.Module, lora: LoRAConfig) -> None:
    """Inject adapters on `lora.target_modules` of every decoder layer; only they (and `lora.train_params`) require
    grad afterwards, in fp32 (peft gives an adapter its base layer's dtype, which may be bf16)."""
    _peft().inject_adapter_in_model(peft_config(lora), model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        trains = is_adapter(name) or name in lora.train_params
        param.requires_grad_(trains)
        if trains:
            param.data = param.data.float()


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merged_weights(
    model: nn.Module, whole: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every weight with its adapter merged in (B·A·scaling added to the base), the adapters
    themselves left out; `whole` gathers a sharded tensor (every rank must call it alike)."""
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        if is_adapter(name):
            continue
        tensor = whole(param.detach())
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(BASE) and leaf == "weight":
            layer = modules[owner.removesuffix(BASE)]
            a = whole(layer.lora_A[ADAPTER].weight.detach())
            b = whole(layer.lora_B[ADAPTER].weight.detach())
            tensor = (tensor.float() + (b.float() @ a.float()) * layer.scaling[ADAPTER]).to(tensor.dtype)
        yield name.replace(BASE, ""), tensor


def trained_state(state: dict[str, torch.Tensor], lora: LoRAConfig) -> dict[str, torch.Tensor]:
    """What trains of a full model state dict: the adapters and `lora.train_params`."""
    return {name: tensor for name, tensor in state.items() if is_adapter(name) or name in lora.train_params}


def as_injected(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A plain HF state dict renamed onto `model`'s injected names (a target's weight under `.base_layer`)."""
    injected = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    renamed = {}
    for name, tensor in state.items():
        owner, _, leaf = name.rpartition(".")
        based = f"{owner}{BASE}.{leaf}"
        renamed[based if based in injected and name not in injected else name] = tensor
    return renamed


@contextlib.contextmanager
def base_only(model: nn.Module, gains: dict[str, torch.Tensor]):
    """`model` as its frozen base for a forward: every adapter switched off (peft's `enable_adapters`) and the trained
    `gains` (name -> their value at the start, `train_params`) swapped in; all restored on exit."""
    layers = [m for m in model.modules() if hasattr(m, "enable_adapters") and hasattr(m, "lora_A")]
    params = dict(model.named_parameters())
    trained = {name: params[name].detach().clone() for name in gains}
    with torch.no_grad():
        for name, value in gains.items():
            params[name].copy_(value)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        with torch.no_grad():
            for name, value in trained.items():
                params[name].copy_(value)


def peft_adapter_tensors(
    model: nn.Module, lora: LoRAConfig, whole: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """What trains, under the names `PeftModel.save_pretrained` writes (`base_model.model.<HF name>`, the adapter's
    name dropped); `whole` gathers a sharded tensor (every rank must call it alike)."""
    tensors = {}
    for name, param in model.named_parameters():
        if is_adapter(name) or name in lora.train_params:
            key = "base_model.model." + name.replace(f".{ADAPTER}.", ".")
            tensors[key] = whole(param.detach()).to("cpu").contiguous()
    return tensors


def synced_tensors(
    model: nn.Module, lora: LoRAConfig, whole: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """What an adapter-only sync moves: each adapter tensor under peft's saved name (`base_model.model.<HF module>
    .lora_A.weight`), each of `lora.train_params` under its HF name (a base weight the engines update in place);
    `whole` gathers a sharded tensor (every rank must call it alike). CPU tensors: a few MB at most."""
    for name, param in model.named_parameters():
        if is_adapter(name):
            yield "base_model.model." + name.replace(f".{ADAPTER}.", "."), whole(param.detach()).to("cpu").contiguous()
        elif name in lora.train_params:
            yield name, whole(param.detach()).to("cpu").contiguous()


def write_peft_adapter(tensors: dict[str, torch.Tensor], lora: LoRAConfig, path: str | Path, base: str) -> None:
    """A peft adapter directory at `path` (adapter_config.json by peft itself, adapter_model.safetensors) that
    `PeftModel.from_pretrained(<the model at base>, path)` loads."""
    modules = [name.removesuffix(".weight") for name in lora.train_params]
    config = peft_config(lora, modules_to_save=modules or None, base_model_name_or_path=base, task_type="CAUSAL_LM")
    config.save_pretrained(str(path))
    save_file(tensors, str(Path(path) / "adapter_model.safetensors"), metadata={"format": "pt"})
