"""A transformers model's tensors under its checkpoint's names, the names every weight-sync bucket carries.

transformers 5 holds some tensors in memory under other names and shapes than its checkpoints hold them: a MoE
layer's experts fused into `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I], where the
checkpoint (and SGLang, vLLM, megatron's export) has `mlp.experts.{e}.gate_proj.weight` [I, H] for each expert.
Both directions use transformers' own mapping, the one `save_pretrained` reverts
(`transformers.core_model_loading.revert_weight_conversion`), so a family transformers fuses differently needs no
code here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.core_model_loading import revert_weight_conversion


def to_checkpoint(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """The checkpoint tensors held in the model's tensor `name` (one, under the same name, for most tensors)."""
    return revert_weight_conversion(model, {name: tensor})


@dataclass(frozen=True, kw_only=True)
class StridedPart:
    """A checkpoint tensor as a view of the contiguous in-memory tensor holding it (`torch.as_strided`'s terms,
    in elements)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def of(self, whole: torch.Tensor) -> torch.Tensor:
        """This part of `whole` as a view: writes to it land in `whole`."""
        if not whole.is_contiguous():
            raise ValueError(f"a tensor holding checkpoint parts must be contiguous (strides {whole.stride()})")
        return whole.as_strided(self.size, self.stride, whole.storage_offset() + self.offset)


def checkpoint_parts(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> dict[str, StridedPart | None]:
    """Where each checkpoint tensor held in the model's tensor `name` lies in it; None: the whole tensor, unchanged
    (under its own name, or renamed only: transformers 5 files a vision-language model's language model under
    `model.language_model.` where its checkpoint has `model.`).

    transformers' reverse conversion is run on the element indices of `tensor`: each output holds the indices it
    took, which a load writes back through as a view (`StridedPart.of`).
    """
    shapes = to_checkpoint(model, name, torch.empty(tensor.shape, device="meta"))
    if list(shapes) == [name] and tuple(shapes[name].shape) == tuple(tensor.shape):
        return {name: None}
    indices = torch.arange(tensor.numel()).view(tensor.shape)
    converted = to_checkpoint(model, name, indices)
    if len(converted) == 1 and torch.equal(next(iter(converted.values())), indices):
        return {next(iter(converted)): None}
    return {part: _strided(indices, taken, part) for part, taken in converted.items()}


def _strided(indices: torch.Tensor, taken: torch.Tensor, part: str) -> StridedPart:
    """The view of `indices` (contiguous) equal to `taken`, its elements chosen by the conversion."""
    flat = taken.reshape(-1)
    offset = int(flat[0]) if flat.numel() else 0
    stride = []  # along each dimension, the index one step on (any stride fits a dimension of size 1)
    for dim, size in enumerate(taken.shape):
        step = [0] * taken.dim()
        step[dim] = 1
        stride.append(int(taken[tuple(step)]) - offset if size > 1 else 1)
    part_view = StridedPart(size=tuple(taken.shape), stride=tuple(stride), offset=offset)
    if not torch.equal(part_view.of(indices), taken):
        raise ValueError(
            f"transformers' conversion of checkpoint tensor {part!r} is not a strided view of its model tensor"
        )
    return part_view
