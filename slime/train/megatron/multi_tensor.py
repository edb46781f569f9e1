"""torch's foreach kernels for megatron-core's multi-tensor ops on CUDA without Transformer Engine or apex.

Without either package (our GPU image), megatron-core's gradient clipping binds the pure-Python fallbacks
of `megatron.core.utils`: `local_multi_tensor_l2_norm` takes one norm per gradient tensor and copies
each to the host to stack them (a stream synchronisation per parameter tensor, 226 a step for
Qwen3-1.7B, each waiting for the GPU to drain), and `local_multi_tensor_scale` launches two kernels per
tensor. `activate(device)` rebinds those names to `l2_norm` and `scale` below (a few foreach launches,
no host copy) where megatron bound the fallbacks; with TE or apex, or on CPU, it changes nothing.
"""

from __future__ import annotations

import torch
from megatron.core import utils
from megatron.core.optimizer import clip_grads, optimizer
from torch import Tensor


def l2_norm(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], per_tensor: bool, *args):
    """(Tensor[1] fp32: the L2 norm of every tensor of `tensor_lists` taken as one vector, None), as
    `amp_C.multi_tensor_l2norm` returns it without per-tensor norms."""
    if per_tensor:
        raise NotImplementedError("per-tensor norms: megatron-core's grad clipping never asks for them")
    tensors = [t for group in tensor_lists for t in group]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = torch.stack([n.float() for n in torch._foreach_norm(tensors)])
    return torch.linalg.vector_norm(norms).reshape(1), None


def scale(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], factor: float) -> None:
    """dst = src · factor for each pair of `tensor_lists` = [srcs, dsts] (in place when they are the same
    tensors), as `amp_C.multi_tensor_scale`."""
    sources, targets = tensor_lists
    if not sources:
        return
    if all(s is t for s, t in zip(sources, targets)):
        torch._foreach_mul_(targets, factor)
        return
    torch._foreach_copy_(targets, torch._foreach_mul(sources, factor) if factor != 1.0 else sources)


def activate(device: str) -> None:
    """Rebind megatron's pure-Python multi-tensor fallbacks to the foreach versions (CUDA only; no-op
    where Transformer Engine or apex supplied the real kernels; idempotent)."""
    if device != "cuda":
        return

    for module in (clip_grads, optimizer):
        if getattr(module, "l2_norm_impl", None) is utils.local_multi_tensor_l2_norm:
            module.l2_norm_impl = l2_norm
        if getattr(module, "multi_tensor_scale_impl", None) is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = scale
