"""The block sums of slime.wire.weight_digest on a CUDA device as one Triton kernel for many tensors: each program
sums one block of DIGEST_BLOCK int16 halves of one tensor into an int32 (|sum| < 2**27 fits) and writes it as an
int64, so a model's tensors are read once, at memory speed, by one launch. torch's `sum(dim=1, dtype=torch.int64)`
over the same blocks gives the same numbers many times slower (a 1.7B model's 3.4 GB took ~50 ms on an H100), and one
launch per tensor pays Python's launch overhead per tensor (hundreds a model); tests/gpu/test_sync_cuda.py pins the
kernel to torch's sums.

Every tensor is addressed as an element offset from the first one's pointer (one address space on a device), so that
where every tensor starts on a 16-byte boundary the kernel can be told so and read 16 bytes at a time.

Imported only where a CUDA tensor is digested and Triton is installed (it comes with torch's CUDA wheels)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _block_sums_kernel(base_ptr, table_ptr, owners_ptr, out_ptr, count, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    block = tl.program_id(0)
    owner = tl.load(owners_ptr + block)
    start = tl.load(table_ptr + owner)  # the table's rows: element offsets from base_ptr, sizes, first blocks
    numel = tl.load(table_ptr + count + owner)
    first = tl.load(table_ptr + 2 * count + owner)
    if ALIGNED:
        start = tl.multiple_of(start, 8)
    offsets = (block - first) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(base_ptr + start + offsets, mask=offsets < numel, other=0).to(tl.int32)
    tl.store(out_ptr + block, tl.sum(values, axis=0).to(tl.int64))


def block_sums_cuda(halves: Sequence[torch.Tensor], block: int) -> torch.Tensor:
    """The int64 sums of blocks of `block` elements of flat contiguous int16 tensors on one CUDA device, joined in
    order (ceil(numel / block) per tensor, the last block of each may be shorter); launched on the current stream,
    read back by no one here."""
    held = [h for h in halves if h.numel()]
    anchor = held[0] if held else halves[0]
    return block_sums_at(anchor, [h.data_ptr() for h in halves], [h.numel() for h in halves], block)


def block_sums_at(anchor: torch.Tensor, addresses: Sequence[int], sizes: Sequence[int], block: int) -> torch.Tensor:
    """`block_sums_cuda` of the int16 runs of `sizes[i]` halves at device addresses `addresses[i]` (the bytes of
    contiguous tensors the caller holds), read through `anchor`, an int16 tensor on their device whose address is
    their base: the caller takes no view per tensor."""
    counts = [triton.cdiv(n, block) for n in sizes]
    total = sum(counts)
    out = torch.empty(total, dtype=torch.int64, device=anchor.device)
    if not total:
        return out
    base = anchor.data_ptr()
    firsts = [0]
    for c in counts[:-1]:
        firsts.append(firsts[-1] + c)
    starts = [(a - base) // 2 if n else 0 for a, n in zip(addresses, sizes)]
    # pinned and non-blocking: a copy from pageable memory would wait for the stream's queued work (a push's copies)
    table = torch.tensor([starts, list(sizes), firsts, counts], dtype=torch.int64, pin_memory=True)
    table = table.to(out.device, non_blocking=True)
    owners = torch.repeat_interleave(
        torch.arange(len(sizes), dtype=torch.int32, device=out.device), table[3], output_size=total
    )
    aligned = base % 16 == 0 and all(a % 16 == 0 for a, n in zip(addresses, sizes) if n)
    _block_sums_kernel[(total,)](anchor, table, owners, out, len(sizes), BLOCK=block, ALIGNED=aligned)
    return out
