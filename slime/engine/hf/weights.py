"""Strict loading of HF-named safetensors into a live transformers model (docs/engines.md#disk-mode).

Every `*.safetensors` file of the directory is read (an index json, if any, is not needed). The set
of tensor names must equal the model's own checkpoint names (a partial load, one bucket of a sync or a directory of
some named tensors, may leave names out) (those `save_pretrained` writes, a MoE layer's
experts one by one, where transformers holds them fused): missing names, unexpected names and
shape mismatches are all reported together and nothing is copied, so a failed update leaves the old
weights intact. Tied aliases (e.g. `lm_head.weight` when embeddings are tied) are optional; when
present they are shape-checked but not copied (the primary tensor wins).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from slime.models.checkpoint_names import StridedPart, checkpoint_parts

_MAX_LISTED = 8  # names listed per category in an error message


class WeightLoadError(ValueError):
    """The checkpoint does not match the model; the message names the offending tensors."""


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of all `*.safetensors` files under `path` (CPU tensors, file dtype)."""
    path = Path(path)
    if not path.is_dir():
        raise WeightLoadError(f"model_path {str(path)!r} is not a directory")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files in {str(path)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file), device="cpu").items():
            if name in tensors:
                raise WeightLoadError(f"tensor {name!r} appears in more than one file under {str(path)!r}")
            tensors[name] = tensor
    return tensors


def _short(names) -> str:
    names = sorted(names)
    extra = f" (+{len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + extra


def _checkpoint_name(name: str) -> str | None:
    """The checkpoint name of a model state name: a LoRA slot's base weight (`q_proj.base_layer.weight`) under
    its projection's name, the adapter's own tensors (`lora_slot.py`) None: no checkpoint holds them."""
    if ".lora_A." in name or ".lora_B." in name:
        return None
    return name.replace(".base_layer.", ".")


class StateLayout:
    """Where each of a model's checkpoint names lives: the module and attribute holding it, read at each use (so
    the layout stays true when `model.to()` replaces buffers or parameter data), and the part of that tensor it is
    where transformers holds several checkpoint tensors in one (a MoE layer's fused experts). Built once per model:
    walking `state_dict()` and `named_parameters()` for every bucket of a weight sync cost ~9 ms a bucket on one
    CPU core for the 310 tensors of the 1.7B shape."""

    def __init__(self, model: torch.nn.Module):
        self.slots: dict[str, tuple[torch.nn.Module, str, StridedPart | None]] = {}
        self.renamed: dict[str, str] = {}  # state name -> the one checkpoint name it holds whole, where they differ
        names: dict[str, set[str]] = {}  # state name -> the checkpoint names it holds
        for name, value in model.state_dict(keep_vars=True).items():
            if _checkpoint_name(name) is None:
                continue
            path, _, attr = name.rpartition(".")
            module = model.get_submodule(path)
            parts = checkpoint_parts(model, name, value)
            names[name] = {_checkpoint_name(part) for part in parts}
            (part, where), *more = parts.items()
            if not more and where is None and _checkpoint_name(part) != name:
                self.renamed[name] = _checkpoint_name(part)
            self.slots.update({_checkpoint_name(part): (module, attr, where) for part, where in parts.items()})
        primary = set().union(*(names[name] for name, _ in model.named_parameters() if name in names))
        all_params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        primary |= set().union(*(held for name, held in names.items() if name not in all_params))  # buffers
        self.primary = frozenset(primary)
        self.aliases = frozenset(set(self.slots) - primary)

    def tensor(self, name: str) -> torch.Tensor:
        module, attr, part = self.slots[name]
        whole = getattr(module, attr)
        return whole if part is None else part.of(whole)


@torch.no_grad()
def load_weights_strict(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    *,
    partial: bool = False,
    layout: StateLayout | None = None,
) -> int:
    """Check `tensors` against the model's checkpoint names and shapes, then copy them in. Returns the count copied.

    Values are cast to each parameter's dtype and moved to its device. `partial`: one bucket of a
    multi-bucket update (tensor and distributed modes), so names may be missing, never unexpected.
    `layout`: the model's `StateLayout`, when the caller loads into it more than once.
    """
    layout = layout or StateLayout(model)
    missing = set() if partial else layout.primary - set(tensors)
    unexpected = set(tensors) - set(layout.slots)
    mismatched = [
        f"{name}: checkpoint {tuple(t.shape)} vs model {tuple(layout.tensor(name).shape)}"
        for name, t in tensors.items()
        if name in layout.slots and tuple(t.shape) != tuple(layout.tensor(name).shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_short(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_short(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(sorted(mismatched)[:_MAX_LISTED])}")
    if problems:
        raise WeightLoadError("checkpoint does not match the model: " + " | ".join(problems))

    pairs = [(layout.tensor(name), tensor) for name, tensor in tensors.items() if name not in layout.aliases]
    copy_all(pairs)
    return len(pairs)


def copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each (target, value) pair, casting the value to its target's dtype. Pairs of one dtype go as one
    multi-tensor copy: a copy launched per tensor spends more time launching than copying on a GPU."""
    same = [(target, value) for target, value in pairs if target.dtype == value.dtype]
    if same:
        torch._foreach_copy_([target for target, _ in same], [value for _, value in same])
    for target, value in pairs:
        if target.dtype != value.dtype:
            target.copy_(value.to(dtype=target.dtype))
