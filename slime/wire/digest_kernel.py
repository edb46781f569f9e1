"""The block sums of slime.wire.weight_digest on a CUDA device as one Triton kernel: each program sums one block of
DIGEST_BLOCK int16 halves into an int32 (|sum| < 2**27 fits) and writes it as an int64, reading the tensor once at
memory speed. torch's `sum(dim=1, dtype=torch.int64)` over the same view gives the same numbers several times slower
(a 1.7B model's 3.4 GB took ~50 ms on an H100); tests/gpu/test_sync_cuda.py pins the two equal.

Imported only where a CUDA tensor is digested and Triton is installed (it comes with torch's CUDA wheels)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _block_sums_kernel(halves_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(halves_ptr + offsets, mask=offsets < numel, other=0).to(tl.int32)
    tl.store(out_ptr + block, tl.sum(values, axis=0).to(tl.int64))


def block_sums_cuda(halves: torch.Tensor, block: int) -> torch.Tensor:
    """int64 sums of a flat contiguous int16 CUDA tensor's blocks of `block` elements (the last may be shorter)."""
    blocks = triton.cdiv(halves.numel(), block)
    out = torch.empty(blocks, dtype=torch.int64, device=halves.device)
    if blocks:
        _block_sums_kernel[(blocks,)](halves, out, halves.numel(), BLOCK=block)
    return out
