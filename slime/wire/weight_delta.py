"""Bitwise weight deltas and checksums: what a delta sync moves and how each side checks what it holds.

A trainer exports bf16 (or fp32) copies of fp32 master weights; after a small optimizer step most exported values
round to the very bits they had, so a push need carry only the elements whose bits changed. Everything here compares
and carries raw bits (each tensor viewed as the signed integer of its element width), so a delta is lossless by
construction: NaN payloads, -0.0 and +0.0 all survive, and `apply_delta(old, delta_of(old, new))` is `new` bit for
bit.

    SparseDelta   (positions of the changed elements, their new bits): what travels
    delta_of      old, new -> SparseDelta        apply_delta   old, SparseDelta -> new (in place)
    bit_checksum  a tensor's bits folded into one integer, on its own device

`bit_checksum` reads the bits as 16-bit halves and takes position-weighted sums of them, exact in int64 over blocks
and then modulo two primes below 2**31 (nothing overflows): a change of any one half (so any bit flip anywhere)
always changes the checksum, since neither the change, its weight nor its block's factor is a multiple of the first
prime; the weights are spread over the residues, so other corruptions (values moved, several changed) pass with a
chance near 2**-62. It runs where the tensor is, with a few integer operations an element (a GPU reads the bytes at
memory speed), instead of copying the bytes to the host for a sha256; it guards against corruption, not against an
adversary.
"""

from __future__ import annotations

import dataclasses

import torch

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CHECKSUM_BLOCK = 1 << 16  # 16-bit halves per block sum: below 2**62 in int64
CHECKSUM_ROWS = 256  # blocks converted to int64 at a time (128 MiB)
CHECKSUM_PRIMES = (2**31 - 1, 2**31 - 19)
CHECKSUM_SPREAD = (1_000_000_007, 998_244_353)  # primes below 2**31: their products with residues fit int64


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as the signed integers of their bits, flat (a view when contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.int8)
    return flat.view(_BITS[flat.element_size()])


@dataclasses.dataclass(frozen=True)
class SparseDelta:
    """The elements whose bits changed: `positions` (int64, into the flat tensor) and their new `values` (the
    tensor's integer view of its dtype). `nbytes` is what it carries."""

    positions: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return (
            self.positions.numel() * 4 + self.values.numel() * self.values.element_size()
        )  # int32 positions on the wire


def delta_of(old: torch.Tensor, new: torch.Tensor) -> SparseDelta:
    """What turns `old` into `new` bit for bit (same shape and dtype)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(
            f"a delta needs equal shapes and dtypes: {tuple(old.shape)} {old.dtype} vs {tuple(new.shape)} {new.dtype}"
        )
    a, b = bits(old), bits(new)
    positions = torch.nonzero(a != b).reshape(-1)
    return SparseDelta(positions=positions, values=b[positions])


def apply_delta(target: torch.Tensor, delta: SparseDelta) -> torch.Tensor:
    """Write `delta`'s values into `target` (contiguous, the old weights) in place; returns it."""
    if not target.is_contiguous():
        raise ValueError("apply_delta writes in place: the target must be contiguous")
    bits(target)[delta.positions.to(target.device)] = delta.values.to(target.device)
    return target


def changed_fraction(old: torch.Tensor, new: torch.Tensor) -> float:
    """The share of elements whose bits differ."""
    return float((bits(old) != bits(new)).sum()) / max(old.numel(), 1)


def _spread(count: int, modulus: int, device: torch.device) -> torch.Tensor:
    """w(j) = ((j^2 * A + j * B) mod modulus) + 1 for j in [0, count): int64 in [1, modulus], no value a fixed
    multiple of another's (a linear w(j) makes a flip of bit k at 2j and one of bit k+1 at j agree)."""
    j = torch.remainder(torch.arange(count, dtype=torch.int64, device=device), modulus)
    square = torch.remainder(j * j, modulus)
    a, b = CHECKSUM_SPREAD
    return torch.remainder(torch.remainder(square * a, modulus) + torch.remainder(j * b, modulus), modulus) + 1


def bit_checksum(tensor: torch.Tensor) -> int:
    """The tensor's bits as 16-bit halves x_i, in blocks of CHECKSUM_BLOCK: S_c = sum of x_i * w(i mod BLOCK) over
    block c (exact in int64), then h_p = sum of S_c * v_p(c) modulo p for both primes, as h1 * 2**32 + h2 (the module
    docstring). w and v are `_spread` values, below both primes' doubles and never zero."""
    flat = bits(tensor)
    halves = flat.view(torch.int16) if flat.element_size() >= 2 else flat.to(torch.int16)
    width = max(1, min(CHECKSUM_BLOCK, halves.numel()))  # a small tensor is one block of its own size
    pad = -halves.numel() % width
    if pad:
        halves = torch.cat([halves, halves.new_zeros(pad)])  # zeros add nothing
    blocks = halves.view(-1, width)
    weights = _spread(width, CHECKSUM_PRIMES[0] - 1, halves.device)
    block_sums = torch.cat(
        [
            (blocks[row : row + CHECKSUM_ROWS].to(torch.int64) * weights).sum(dim=1)  # |.| < 2**15 * 2**31 * 2**16
            for row in range(0, blocks.shape[0], CHECKSUM_ROWS)
        ]
        or [torch.zeros(0, dtype=torch.int64, device=halves.device)]  # an empty tensor
    )
    out = []
    for prime in CHECKSUM_PRIMES:
        factors = _spread(block_sums.numel(), prime - 1, halves.device)
        terms = torch.remainder(torch.remainder(block_sums, prime) * factors, prime)  # each < 2**31
        out.append(int(torch.remainder(terms.sum(), prime).item()))
    return (out[0] << 32) | out[1]
