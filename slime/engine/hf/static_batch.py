"""`StaticBatch`: a `RunningBatch` whose decode steps run on the generator's slots (`static_cache.SlotDecoder`),
where one decode step is one in-place write per layer and, on a GPU, one CUDA graph replay.

Rows are prefilled as in `RunningBatch` (a left-padded batch on a DynamicCache, the prefix cache's prefills
included) and move into slots at their first decode step; the batch then keeps `slots` (row i's slot) instead of
`cache`, `mask` and `next_pos`. A row that finishes frees its slot; a row that joins is copied into a free one.
Two cases keep the dynamic path of `RunningBatch`: the first decode step of a lone request (the prefix cache's,
bit for bit) and a batch that finds the slots held by another live batch (each generator has one set).
"""

from __future__ import annotations

from typing import Optional

import torch

from slime.engine.hf.batch import Generator, Row, RunningBatch
from slime.engine.hf.prefix_cache import CACHED_DECODE_STEPS
from slime.engine.hf.static_cache import SlotDecoder


class StaticBatch(RunningBatch):
    """The rows decoded together on `gen`'s model and `decoder`'s slots (see the module docstring)."""

    def __init__(self, gen: Generator, decoder: SlotDecoder):
        self.decoder = decoder
        self.slots: Optional[list[int]] = None  # None: the rows are on the dynamic cache
        super().__init__(gen)

    def _clear(self) -> None:
        if self.slots is not None:
            self.decoder.release(self)
        self.slots = None
        super()._clear()

    def _join(self, rows: list[Row], cache, mask, next_pos, logits, sampler) -> None:
        if not self.rows or not self._to_slots():
            super()._join(rows, cache, mask, next_pos, logits, sampler)
            return
        self.slots += self.decoder.load(cache, mask, bound(rows))
        self.logits = torch.cat([self.logits, logits])
        self.sampler.extend(sampler)
        self.rows += rows
        self.shared = self.solo = False

    def _to_slots(self) -> bool:
        """Move the rows into slots (once); False where another live batch holds them."""
        if self.slots is not None:
            return True
        if not self.decoder.acquire(self):
            return False
        self.slots = self.decoder.load(self.cache, self.mask, bound(self.rows))
        self.cache = self.mask = self.next_pos = None  # a shared (prefix cache) cache was only read
        self.shared = False
        return True

    def _feed(self, tokens: torch.Tensor) -> None:
        prefix_step = self.solo and self.steps <= CACHED_DECODE_STEPS and self.gen.prefix_cache.enabled
        if self.slots is None and (prefix_step or not self._to_slots()):
            super()._feed(tokens)
            return
        self.logits = self.decoder.step(tokens, self.slots)

    def _select(self, keep: list[int]) -> None:
        if self.slots is None:
            super()._select(keep)
            return
        kept = set(keep)
        self.decoder.free([slot for i, slot in enumerate(self.slots) if i not in kept])
        self.slots = [self.slots[i] for i in keep]
        self.sampler.select(keep)
        self.rows = [self.rows[i] for i in keep]


def bound(rows: list[Row]) -> int:
    """The most tokens any of `rows` will hold: its prompt and its token budget."""
    return max(len(row.req.input_ids) + row.budget for row in rows)
