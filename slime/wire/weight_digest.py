"""A digest of a tensor's bits computed where the tensor is: what a verified sync compares on both ends when the
engine can run it (the built-in engine), instead of copying every tensor to the host for a sha256.

A tensor's bits are read as 16-bit halves x_i (one-byte dtypes widened), cut into blocks of DIGEST_BLOCK; each block
sums its halves exactly (on a GPU one kernel for all of a bucket's or a model's tensors, at memory speed; on the CPU
into int32, which |sum| < 2**27 fits and numpy reduces twice as fast as into int64), and the block sums S_c are
folded, on their device for all tensors at once, into two residues:

    h1 = sum_c S_c mod P1        h2 = sum_c (S_c mod P2) * w(c) mod P2        digest = f"{h1:08x}{h2:08x}"

with w(c) in [1, P2) spread over the blocks. Any change of one half (so any flipped bit or byte) changes its block's
sum by a non-zero amount below 2**16 < P1, so h1 always changes; a block's sum moved to another block changes h2.
Changes that keep every block's sum (two halves of one block swapped) are not seen: this guards against corruption in
transit and stale tensors, not against an adversary. The digest is the same on every device (integer arithmetic).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import numpy as np
import torch

try:  # Triton comes with torch's CUDA wheels only; a CPU machine digests with numpy
    from slime.wire.digest_kernel import block_sums_at, block_sums_cuda
except ImportError:
    block_sums_at = block_sums_cuda = None

logger = logging.getLogger(__name__)

DIGEST_BLOCK = 4096  # halves per block sum: |sum| < 2**15 * 2**12
P1, P2 = 2**31 - 1, 2**31 - 19
SPREAD = 1_000_000_007  # w(c) = (c * SPREAD mod (P2 - 1)) + 1
DIGEST = "block_sums"  # the name the built-in engine reports its digests under


def halves(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as flat int16 (a view of a contiguous tensor of 2-, 4- or 8-byte elements)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.element_size() == 1:  # the raw byte (a bool's too), widened
        return flat.view(torch.uint8).to(torch.int16)
    return flat.view(torch.int16)


def block_sums(tensor: torch.Tensor) -> torch.Tensor | np.ndarray:
    """int64 sums of the tensor's halves, one per block of DIGEST_BLOCK (the last block may be shorter): on the CPU a
    numpy array (numpy's reduction reads several times faster than torch's there), elsewhere a tensor on its device
    (`block_sums_of` digests many at once)."""
    x = halves(tensor)
    if x.device.type == "cpu":
        full = x.numel() // DIGEST_BLOCK * DIGEST_BLOCK
        host = x.numpy()
        sums = [host[:full].reshape(-1, DIGEST_BLOCK).sum(axis=1, dtype=np.int32).astype(np.int64)] if full else []
        sums += [host[full:].sum(dtype=np.int64).reshape(1)] if full < x.numel() else []
        return np.concatenate(sums) if sums else np.zeros(0, dtype=np.int64)
    return _reduced(x)


@dataclasses.dataclass(frozen=True)
class BlockSums:
    """The block sums of several tensors of one device, joined in order: `joined` int64 [sum(counts)] on that
    device, `counts` the blocks of each tensor (ceil(numel / DIGEST_BLOCK) of its halves)."""

    joined: torch.Tensor
    counts: tuple[int, ...]


def block_sums_of(tensors: Sequence[torch.Tensor]) -> BlockSums:
    """The block sums of tensors on one device: on CUDA one Triton launch for all of them (slime.wire.digest_kernel;
    launched, not awaited), elsewhere each tensor's `block_sums`."""
    device = tensors[0].device
    kernel = _cuda_kernel(device) if device.type == "cuda" else None
    if kernel is not None:
        flat = [halves(t) for t in tensors]
        return BlockSums(kernel(flat, DIGEST_BLOCK), tuple(-(-x.numel() // DIGEST_BLOCK) for x in flat))
    sums = [block_sums(t) for t in tensors]
    sums = [torch.from_numpy(s) if isinstance(s, np.ndarray) else s for s in sums]
    joined = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.int64, device=device)
    return BlockSums(joined, tuple(s.numel() for s in sums))


def block_sums_in_place(tensors: Sequence[torch.Tensor]) -> BlockSums | None:
    """`block_sums_of` for contiguous CUDA tensors of one device with 2-, 4- or 8-byte elements, launched from their
    addresses and sizes alone (no view per tensor: the host's work is a few attribute reads a tensor); None where the
    Triton kernel is not in use there (the caller then takes `block_sums_of`)."""
    device = tensors[0].device
    if _cuda_kernel(device) is None:
        return None
    sizes = [t.numel() * t.element_size() // 2 for t in tensors]
    anchor = next((t for t in tensors if t.numel()), tensors[0]).detach().reshape(-1).view(torch.int16)
    joined = block_sums_at(anchor, [t.data_ptr() for t in tensors], sizes, DIGEST_BLOCK)
    return BlockSums(joined, tuple(-(-n // DIGEST_BLOCK) for n in sizes))


def _reduced(x: torch.Tensor) -> torch.Tensor:
    """torch's block sums of flat int16 halves on their device."""
    full = x.numel() // DIGEST_BLOCK * DIGEST_BLOCK
    sums = [x[:full].view(-1, DIGEST_BLOCK).sum(dim=1, dtype=torch.int64)] if full else []
    if full < x.numel():
        sums.append(x[full:].sum(dtype=torch.int64).reshape(1))
    return torch.cat(sums) if len(sums) > 1 else (sums[0] if sums else x.new_zeros(0, dtype=torch.int64))


@functools.cache
def _cuda_kernel(device: torch.device):
    """The Triton block sums (slime.wire.digest_kernel) once they gave torch's of test tensors on `device` (every
    extreme half, ragged last blocks, an empty tensor, tensors on 16-byte boundaries and off them), else None with a
    warning (torch's reduction then): a digest never depends on a kernel that is missing, did not build or
    disagrees."""
    problem = "are not installed (no Triton)"
    if block_sums_cuda is not None:
        try:
            test = torch.arange(-32768, 32768, 7, dtype=torch.int16, device=device)
            cases = [[test], [test, test[:0], test[3:], test[:4097]]]
            if all(torch.equal(block_sums_cuda(c, DIGEST_BLOCK), torch.cat([_reduced(x) for x in c])) for c in cases):
                return block_sums_cuda
            problem = "differ from torch's on a test tensor"
        except Exception as exc:  # noqa: BLE001 - a kernel that does not build here: torch's reduction
            problem = f"failed ({type(exc).__name__}: {exc})"
    logger.warning("weight digests on %s use torch's reduction (slower): the Triton block sums %s", device, problem)
    return None


def fold(sums: BlockSums) -> list[str]:
    """The digest text of each tensor from its block sums, folded on their device at once: each residue scattered
    into its tensor's slot; two integers per tensor come back."""
    joined, n = sums.joined, len(sums.counts)
    device = joined.device
    counts = torch.tensor(sums.counts, dtype=torch.int64).to(device)
    owner = torch.repeat_interleave(torch.arange(n, device=device), counts, output_size=joined.numel())
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(joined.numel(), dtype=torch.int64, device=device) - starts[owner]
    weights = torch.remainder(position * SPREAD, P2 - 1) + 1
    h1 = torch.zeros(n, dtype=torch.int64, device=device).index_add_(0, owner, torch.remainder(joined, P1))
    terms = torch.remainder(torch.remainder(joined, P2) * weights, P2)
    h2 = torch.zeros(n, dtype=torch.int64, device=device).index_add_(0, owner, terms)
    both = torch.stack([torch.remainder(h1, P1), torch.remainder(h2, P2)], dim=1).tolist()
    return [f"{a:08x}{b:08x}" for a, b in both]


def digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """The digest of each tensor: the block sums of each device's tensors together where they live, folded there,
    two integers each to the host."""
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out: list[str] = [""] * len(tensors)
    for indices in by_device.values():
        for i, text in zip(indices, fold(block_sums_of([tensors[i] for i in indices]))):
            out[i] = text
    return out


def folded(sums: Sequence[BlockSums]) -> list[str]:
    """The digest text of each tensor of `sums` (launched by `block_sums_of`), in order, folded per device: the only
    point that waits for an accelerator's reductions (a caller may launch them while other work runs and fold them
    later)."""
    by_device: dict[torch.device, list[BlockSums]] = {}
    for s in sums:
        by_device.setdefault(s.joined.device, []).append(s)
    texts = {
        device: iter(fold(BlockSums(torch.cat([s.joined for s in group]), sum((s.counts for s in group), ()))))
        for device, group in by_device.items()
    }
    return [next(texts[s.joined.device]) for s in sums for _ in s.counts]
