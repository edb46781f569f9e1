"""Packed THD micro-batches for the megatron backend, context-parallel aware
(docs/architecture.md#packed-micro-batches).

The samples of a micro-batch are concatenated into one stream without per-sample padding, except
that with context parallelism (cp > 1) each sample is right-padded to a multiple of 2·cp and split
zigzag: CP rank r keeps chunks r and 2cp−1−r of every sample. With sequence parallelism a padding
sample makes the local stream a multiple of tp. Positions restart at 0 per sample; the micro-batch's
RoPE tables are gathered by them once (`packed_seq_params`), and `cu_seqlens` keep the full padded
lengths (the attention's sample boundaries).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from torch import Tensor

from slime.train.megatron import rope


@dataclass
class MicroBatch:
    """One rank's share of a packed micro-batch.

    input_ids, position_ids: Tensor[1, t] int64 (t = local stream length).
    cu_seqlens: Tensor[n+1] int32, full padded sample boundaries; max_seqlen: the longest padded sample.
    rows[r], index[r]: for CP rank r, its local stream rows that score response tokens and the position of
    each such token in the micro-batch's flat response column (N tokens, sample order); targets[r]: their ids.
    """

    input_ids: Tensor
    position_ids: Tensor
    cu_seqlens: Tensor
    max_seqlen: int
    rows: list[Tensor]
    index: list[Tensor]
    targets: list[Tensor]
    num_tokens: int  # N, the response tokens of the micro-batch
    cp_rank: int
    host_cu_seqlens: tuple[int, ...] = ()  # cu_seqlens on the host (the per-segment attention paths read it)
    _params: object = field(default=None, repr=False)

    def packed_seq_params(self, *, rotary, dtype: torch.dtype, cp_group=None):
        """The micro-batch's `PackedParams` (built once, then reused by every layer and model chunk)."""
        if self._params is None:
            cos, sin = rope.tables(rotary, self.position_ids, self.max_seqlen, dtype)
            self._params = _params_class()(
                qkv_format="thd",
                cu_seqlens_q=self.cu_seqlens,
                cu_seqlens_kv=self.cu_seqlens,
                max_seqlen_q=self.max_seqlen,
                max_seqlen_kv=self.max_seqlen,
                cp_group=cp_group,
                host_cu_seqlens=self.host_cu_seqlens,
                rope_cos=cos,
                rope_sin=sin,
            )
        return self._params


@functools.cache
def _params_class():
    """megatron's PackedSeqParams plus what every layer would otherwise recompute or read back from the
    device: the host copy of cu_seqlens and the micro-batch's RoPE tables (`slime.train.megatron.rope`)."""

    @dataclass
    class PackedParams(PackedSeqParams):
        host_cu_seqlens: tuple[int, ...] = ()
        rope_cos: Optional[Tensor] = None  # [t, 1, 1, d] in the compute dtype
        rope_sin: Optional[Tensor] = None

    return PackedParams


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _local_row(offset: int, start: int, length: int, cp: int, cp_rank: int) -> int | None:
    """Local stream row of position `offset` of the sample at padded stream `start` (None: another rank's)."""
    if cp == 1:
        return start + offset
    c = length // (2 * cp)
    j, within = divmod(offset, c)
    if j == cp_rank:
        return start // cp + within
    if j == 2 * cp - 1 - cp_rank:
        return start // cp + c + within
    return None


def build(
    token_lists: list[list[int]],
    response_lengths: list[int],
    *,
    cp: int = 1,
    cp_rank: int = 0,
    tp_multiple: int = 1,
    pad_id: int = 0,
    device: torch.device | str = "cpu",
    min_total: int = 0,
) -> MicroBatch:
    """Pack samples (each a prompt of ≥ 1 token then `response_lengths[i]` response tokens) for CP rank
    `cp_rank`; `tp_multiple` > 1 pads the local stream to a multiple of it (sequence parallel);
    `min_total` pads the full stream to at least that many tokens (rounded up to the same multiples)."""
    unit = 2 * cp if cp > 1 else 1
    ids: list[int] = []
    positions: list[int] = []
    cu = [0]
    scored: list[tuple[int, int, int, int]] = []  # (sample start, padded length, offset, target)
    for tokens, response in zip(token_lists, response_lengths):
        prompt = len(tokens) - response
        if prompt < 1:
            raise ValueError(
                f"a sample needs a prompt token before its response; got {len(tokens)} tokens, {response} response"
            )
        padded = _round_up(len(tokens), unit)
        start = cu[-1]
        ids.extend(list(tokens) + [pad_id] * (padded - len(tokens)))
        positions.extend(range(padded))
        scored.extend((start, padded, prompt - 1 + k, tokens[prompt + k]) for k in range(response))
        cu.append(start + padded)
    multiple = unit * tp_multiple
    extra = max((-cu[-1]) % multiple, _round_up(min_total, multiple) - cu[-1])
    if extra:  # a padding sample: the local stream divides by tp, or reaches min_total
        ids.extend([pad_id] * extra)
        positions.extend(range(extra))
        cu.append(cu[-1] + extra)
    full_ids = torch.tensor(ids, dtype=torch.long)
    full_pos = torch.tensor(positions, dtype=torch.long)
    keep = local_positions(cu, cp, cp_rank)
    rows, index, targets = [], [], []
    for r in range(cp):
        r_rows = [(i, _local_row(off, s, length, cp, r), t) for i, (s, length, off, t) in enumerate(scored)]
        r_rows = [(i, row, t) for i, row, t in r_rows if row is not None]
        index.append(torch.tensor([i for i, _, _ in r_rows], dtype=torch.long).to(device))
        rows.append(torch.tensor([row for _, row, _ in r_rows], dtype=torch.long).to(device))
        targets.append(torch.tensor([t for _, _, t in r_rows], dtype=torch.long).to(device))
    return MicroBatch(
        input_ids=full_ids[keep].unsqueeze(0).to(device),
        position_ids=full_pos[keep].unsqueeze(0).to(device),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32).to(device),
        host_cu_seqlens=tuple(cu),
        max_seqlen=max(b - a for a, b in zip(cu[:-1], cu[1:])),
        rows=rows,
        index=index,
        targets=targets,
        num_tokens=len(scored),
        cp_rank=cp_rank,
    )


def local_positions(cu: list[int], cp: int, cp_rank: int) -> Tensor:
    """Stream positions this CP rank holds, in its local order (chunk r, then chunk 2cp−1−r, per sample)."""
    if cp == 1:
        return torch.arange(cu[-1])
    parts = []
    for s, e in zip(cu[:-1], cu[1:]):
        c = (e - s) // (2 * cp)
        for j in (cp_rank, 2 * cp - 1 - cp_rank):
            parts.append(torch.arange(s + j * c, s + (j + 1) * c))
    return torch.cat(parts)


def padded_total(token_lists: list[list[int]], *, cp: int = 1, tp_multiple: int = 1) -> int:
    """The full stream length `build` makes of these samples (before `min_total`)."""
    unit = 2 * cp if cp > 1 else 1
    total = sum(_round_up(len(t), unit) for t in token_lists)
    return _round_up(total, unit * tp_multiple)
