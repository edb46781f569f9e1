"""LoRA adapters on the built-in engine, served as SGLang 0.5.23 serves them with `--enable-lora`.

At start, peft's LoRA layers (rank `--max-lora-rank`) are injected on `--lora-target-modules` of every decoder
layer, zero and switched off. An adapter arrives by name, as a peft adapter (its `adapter_config.json` as a dict
and its tensors under peft's saved names, `base_model.model.<HF module>.lora_A.weight` / `lora_B.weight`):
`/load_lora_adapter_from_tensors` (`managers/io_struct.py:LoadLoRAAdapterFromTensorsReqInput`) or
`/load_lora_adapter` from a directory (`LoadLoRAAdapterReqInput`); `/unload_lora_adapter` drops it. A request
names its adapter in `lora_path` (`GenerateReqInput.lora_path`); naming one that is not loaded is an error, as
SGLang's `tokenizer_manager.py` answers it. This engine holds one adapter at a time (SGLang's
`--max-loaded-loras 1`), and runs each batch with the adapter on or off (the scheduler never mixes them).

An adapter of rank r below the slot's fills the first r rows of A and columns of B (the rest stay zero), and
its own alpha / r scales it, as SGLang's memory pool pads lower-rank adapters to `max_lora_rank`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from slime.engine.hf.generator import GenerationError

ADAPTER = "default"  # peft's name for the one injected adapter
# SGLang's answer to a LoRA call or request on a server without --enable-lora (`tokenizer_control_mixin.py`)
NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
PEFT_PREFIX = "base_model.model."  # peft's saved names: the wrapped model's module names behind this


class LoRASlot:
    """The engine's adapter slot over `model` (rank `max_rank` on `target_modules`); `loaded` names its adapter."""

    def __init__(self, model: nn.Module, *, max_rank: int, target_modules: list[str]):
        import peft  # ~4 s to import: only a server started with --enable-lora loads it

        config = peft.LoraConfig(r=max_rank, lora_alpha=max_rank, target_modules=list(target_modules))
        peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        model.requires_grad_(False)
        self.max_rank = max_rank
        self.target_modules = list(target_modules)
        self.layers = {
            name: module for name, module in model.named_modules() if hasattr(module, "lora_A") and module.lora_A
        }
        self.loaded: str | None = None
        self.rank = 0  # the loaded adapter's
        self.modules: list[str] = []  # the modules the loaded adapter adapts
        self.active = True
        self._zero()
        self.use(None)

    def use(self, name: str | None) -> bool:
        """Switch the adapter on for a batch whose requests name `name` (off for None); True if that changed it."""
        on = name is not None
        if on == self.active:
            return False
        for layer in self.layers.values():
            layer.enable_adapters(on)
        self.active = on
        return True

    def check_request(self, name: str | None) -> None:
        """GenerationError (HTTP 400) when a request names an adapter that is not loaded."""
        if name is not None and name != self.loaded:
            raise GenerationError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {[self.loaded] if self.loaded else []}."
            )

    def load(self, name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Load adapter `name` (peft's config dict, its tensors by peft's saved names) into the slot."""
        if self.loaded is not None:
            raise GenerationError(
                f"LoRA adapter {self.loaded!r} is loaded; this engine holds one adapter: unload it before loading "
                f"{name!r}"
            )
        rank, scaling = self._shape_of(config)
        pairs = self._pairs(tensors, rank)
        with torch.no_grad():
            for module, (a, b) in pairs.items():
                layer = self.layers[module]
                layer.lora_A[ADAPTER].weight[:rank].copy_(a)
                layer.lora_B[ADAPTER].weight[:, :rank].copy_(b)
                layer.scaling[ADAPTER] = scaling
        self.loaded, self.rank, self.modules = name, rank, sorted(pairs)

    def held_tensors(self) -> dict[str, torch.Tensor]:
        """The loaded adapter's tensors as the slot holds them, by peft's saved names (empty when none is loaded)."""
        if self.loaded is None:
            return {}
        held = {}
        for module in self.modules:
            layer = self.layers[module]
            held[f"{PEFT_PREFIX}{module}.lora_A.weight"] = layer.lora_A[ADAPTER].weight[: self.rank]
            held[f"{PEFT_PREFIX}{module}.lora_B.weight"] = layer.lora_B[ADAPTER].weight[:, : self.rank]
        return held

    def load_dir(self, name: str, path: str) -> None:
        """Load the peft adapter directory at `path` (adapter_config.json, adapter_model.safetensors)."""
        directory = Path(path)
        try:
            config = json.loads((directory / "adapter_config.json").read_text())
            tensors = load_file(str(directory / "adapter_model.safetensors"))
        except (OSError, ValueError) as exc:
            raise GenerationError(f"cannot read the LoRA adapter at {path}: {exc}") from None
        self.load(name, config, tensors)

    def unload(self, name: str) -> None:
        if name != self.loaded:
            raise GenerationError(f"LoRA adapter {name!r} is not loaded (loaded: {self.loaded!r})")
        self._zero()
        self.loaded, self.rank, self.modules = None, 0, []

    def _zero(self) -> None:
        with torch.no_grad():
            for layer in self.layers.values():
                layer.lora_A[ADAPTER].weight.zero_()
                layer.lora_B[ADAPTER].weight.zero_()

    def _shape_of(self, config: dict[str, Any]) -> tuple[int, float]:
        """(rank, alpha / rank) of a peft config dict; GenerationError for one this slot cannot hold."""
        try:
            rank, alpha = int(config["r"]), float(config["lora_alpha"])
        except (KeyError, TypeError, ValueError):
            raise GenerationError("the adapter's config needs integer 'r' and numeric 'lora_alpha'") from None
        if not 0 < rank <= self.max_rank:
            raise GenerationError(f"the adapter's rank {rank} is not in [1, --max-lora-rank {self.max_rank}]")
        targets = config.get("target_modules") or []
        outside = sorted(set([targets] if isinstance(targets, str) else targets) - set(self.target_modules))
        if outside:
            raise GenerationError(f"the adapter targets {outside}, outside --lora-target-modules {self.target_modules}")
        return rank, alpha / rank

    def _pairs(self, tensors: dict[str, torch.Tensor], rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{module name: (A [rank, in], B [out, rank])} of every adapted module; GenerationError for a name or
        shape that does not fit."""
        found: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            module, _, part = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
            if part not in ("A.weight", "B.weight") or module not in self.layers:
                raise GenerationError(f"adapter tensor {key!r} names no LoRA layer of this model")
            found.setdefault(module, {})[part[0]] = tensor
        pairs = {}
        for module, parts in found.items():
            if set(parts) != {"A", "B"}:
                raise GenerationError(f"adapter of {module!r} lacks lora_{'B' if 'A' in parts else 'A'}")
            layer = self.layers[module]
            a, b = parts["A"], parts["B"]
            ok_a = a.dim() == 2 and a.shape[1] == layer.lora_A[ADAPTER].in_features and a.shape[0] == rank
            ok_b = b.dim() == 2 and b.shape[0] == layer.lora_B[ADAPTER].out_features and b.shape[1] == a.shape[0]
            if not (ok_a and ok_b):
                raise GenerationError(f"adapter of {module!r}: A {tuple(a.shape)} / B {tuple(b.shape)} do not fit")
            pairs[module] = (a, b)
        return pairs
