"""The rows the hf engine decodes together: `RunningBatch`.

Rows enter through `add` (their prompts prefilled as one left-padded batch of their own, then merged into the
running rows) and leave through `step` as soon as they finish. `Generator.generate` runs one static batch with it
(everything added once); the scheduler adds rows between steps (continuous batching).

The state between steps, for B live rows after the last forward whose KV cache holds W positions:
- `cache`: a DynamicCache, [B, kv heads, W, head dim] per layer. Each row's tokens end at column W - 1; a row with
  fewer than W fed tokens has zeros on its left (left padding, masked out).
- `mask`: [B, W] long, 1 where the row has a fed token.
- `next_pos`: [B] long, the position id of each row's next token (its own count of fed tokens; a row with images
  less the positions its image tokens share, `image_rows`).
- `logits`: [B, V] the last forward's logits, which the next `step` samples from.

A batch of one row that was prefilled alone and never joined by another is a lone request's computation: only
then does it read and fill the prefix cache's first-token decode step (`prefix_cache.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from slime.engine.hf.prefix_cache import CACHED_DECODE_STEPS
from slime.engine.hf.request import GenerationRequest, GenerationResult
from slime.engine.hf.sampling import DEFAULT_SAMPLING_SEED, LogitsSampler


class Generator(Protocol):
    """What a batch uses of the generator that owns it (`slime.engine.hf.generator.Generator`): its model's forward
    passes, request limits and finish rules, and its shared state."""

    device: torch.device
    vocab_size: int
    pad_token_id: int
    batch_invariant: bool
    generator: torch.Generator
    prefix_cache: Any
    router_tap: Any
    num_generated_tokens: int

    def max_new_tokens(self, req: GenerationRequest) -> int: ...
    def stop_ids(self, params: Any) -> set[int]: ...
    def prefill(self, prompts, ids, mask, position_ids, images: Optional[dict] = None): ...
    def decode_step(self, prompt, generated, tokens, mask, positions, state): ...
    def finish_reason(self, req: GenerationRequest, ids: list[int], budget: int, stop_ids: set[int]): ...
    def final_text(self, params: Any, ids: list[int], reason: dict) -> str: ...


@dataclass(eq=False)
class Row:
    """One request's progress. `key` is the caller's handle for it (returned with its result)."""

    req: GenerationRequest
    key: Any
    budget: int  # max new tokens
    stop_ids: set[int]
    out_ids: list[int] = field(default_factory=list)
    out_lps: list[float] = field(default_factory=list)
    reason: Optional[dict] = None  # the finish reason, once finished
    cached: int = 0  # prompt tokens served by the prefix cache
    routes: list[torch.Tensor] = field(default_factory=list)  # each forward's [tokens, MoE layers, top-k]


def left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` up to `width` entries there."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [missing, 0]
    return F.pad(tensor, pad)


def image_rows(requests: Sequence[GenerationRequest], width: int, device) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """(position ids [3, B, width] left-padded, the rows' images as the model's keyword arguments, next position
    [B]) of a prefill in which some rows carry images (`GenerationRequest.vision`): such a row's multimodal RoPE
    positions, a text row's 0..L-1 on all three axes; a row's next token sits at its last position + 1."""
    positions = torch.zeros((3, len(requests), width), dtype=torch.long)
    next_pos = []
    for i, req in enumerate(requests):
        length = len(req.input_ids)
        vision = req.vision
        positions[:, i, width - length :] = vision.positions if vision is not None else torch.arange(length)
        next_pos.append(length + (vision.delta if vision is not None else 0))
    pixels = [req.vision.pixels for req in requests if req.vision is not None]
    images = {
        "pixel_values": torch.cat([p.pixel_values for p in pixels]).to(device),
        "image_grid_thw": torch.cat([p.image_grid_thw for p in pixels]).to(device),
    }
    return positions.to(device), images, torch.tensor(next_pos, device=device)


def joinable(cache: DynamicCache) -> bool:
    """Whether `merge_caches` can merge caches of this layout: plain full-attention layers only (a sliding window's
    or a sparse indexer's layer keeps more state than its keys and values)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def merge_caches(first: DynamicCache, second: DynamicCache) -> DynamicCache:
    """A new cache with `first`'s rows then `second`'s, [B1 + B2, heads, W, dim] per layer with W the longer of
    the two lengths, the shorter side's rows padded with zeros on the left (the caller masks them out). Neither
    input changes (either may be the prefix cache's)."""
    width = max(first.get_seq_length(), second.get_seq_length())
    pairs = [
        (
            torch.cat([left_pad(a.keys, width, -2), left_pad(b.keys, width, -2)]),
            torch.cat([left_pad(a.values, width, -2), left_pad(b.values, width, -2)]),
        )
        for a, b in zip(first.layers, second.layers)
    ]
    return DynamicCache(ddp_cache_data=pairs)  # one DynamicLayer per pair: the layout `joinable` admits


class RunningBatch:
    """The rows decoded together on `gen`'s model (see the module docstring for the state's shapes)."""

    def __init__(self, gen: Generator):
        self.gen = gen
        self._clear()

    def _clear(self) -> None:
        self.rows: list[Row] = []
        self.cache: Optional[DynamicCache] = None
        self.mask = self.next_pos = self.logits = None
        self.sampler: Optional[LogitsSampler] = None
        self.shared = False  # `cache` is the prefix cache's: copied before a forward extends it
        self.solo = False  # one row prefilled alone, never joined: a lone request's computation
        self.steps = 0  # tokens sampled by the rows since the batch started

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def add(self, requests: Sequence[GenerationRequest], keys: Iterable[Any]) -> list[tuple[Any, GenerationResult]]:
        """Prefill `requests` and make them rows of the batch; their first token comes with the next `step`.
        Returns (key, result) of those that end at once (aborted, or no token budget)."""
        gen, done, rows = self.gen, [], []
        for req, key in zip(requests, keys):
            row = Row(req, key, gen.max_new_tokens(req), gen.stop_ids(req.params))
            if req.aborted:
                row.reason = {"type": "abort", "message": "Abort before prefill"}
            elif row.budget <= 0:
                row.reason = {"type": "length", "length": 0}
            (done if row.reason else rows).append(row)
        if rows:
            self._join(rows, *self._prefill(rows))
        return [(row.key, self._result(row)) for row in done]

    def _prefill(self, rows: list[Row]):
        """(cache, mask [b, w], next_pos [b], logits [b, V], sampler) of `rows`' prompts, left-padded to w."""
        gen, prompts = self.gen, [row.req.input_ids for row in rows]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(rows), width), gen.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(gen.device), mask.to(gen.device)
        sampler = LogitsSampler(
            [row.req.params for row in rows],
            prompts,
            vocab_size=gen.vocab_size,
            device=gen.device,
            stop_ids_per_row=[sorted(row.stop_ids) for row in rows],
            generator=gen.generator,
            default_seed=DEFAULT_SAMPLING_SEED if gen.batch_invariant else None,
        )
        positions, images, next_pos = (mask.cumsum(-1) - 1).clamp(min=0), None, mask.sum(-1)
        if any(row.req.vision is not None for row in rows):
            positions, images, next_pos = image_rows([row.req for row in rows], width, gen.device)
        cache, logits, hit = gen.prefill(prompts, ids, mask, positions, images)
        if hit:
            rows[0].cached = len(prompts[0]) - 1
        self._take_routes(rows, width, prefill=True)
        return cache, mask, next_pos, logits, sampler

    def _join(self, rows: list[Row], cache, mask, next_pos, logits, sampler: LogitsSampler) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask, self.next_pos, self.logits = rows, cache, mask, next_pos, logits
            self.sampler, self.steps = sampler, 0
            self.solo = len(rows) == 1 and rows[0].req.vision is None  # an image prompt is no prefix cache's
            self.shared = self.solo and self.gen.prefix_cache.enabled  # a lone prefill is the prefix cache's
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache = merge_caches(self.cache, cache)
        self.mask = torch.cat([left_pad(self.mask, width, 1), left_pad(mask, width, 1)])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.logits = torch.cat([self.logits, logits])
        self.sampler.extend(sampler)
        self.rows += rows
        self.shared = self.solo = False  # the merged cache is a new one

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, GenerationResult]]:
        """Sample every row's next token; rows that finish leave (returned as (key, result)); the others' tokens are
        fed to the model, whose logits the next step samples."""
        tokens, logprobs = self.sampler.step(self.logits)
        self.steps += 1
        self.gen.num_generated_tokens += len(self.rows)
        keep = self._append(tokens.tolist(), logprobs.tolist())
        results = [(row.key, self._result(row)) for row in self.rows if row.reason is not None]
        if not keep:
            self._clear()
        elif results:
            self._select(keep)
            self._feed(tokens[torch.tensor(keep, device=self.gen.device)])
        else:
            self._feed(tokens)
        return results

    def _append(self, tokens: list[int], logprobs: list[float]) -> list[int]:
        """Give each row its sampled token and finish reason; returns the positions of the rows that go on."""
        keep = []
        for i, (row, token, logprob) in enumerate(zip(self.rows, tokens, logprobs)):
            row.out_ids.append(token)
            row.out_lps.append(logprob)
            row.reason = self.gen.finish_reason(row.req, row.out_ids, row.budget, row.stop_ids)
            if row.reason is None:
                keep.append(i)
        return keep

    def _feed(self, tokens: torch.Tensor) -> None:
        """One forward of the rows' sampled `tokens` [B]: the cache, mask and positions grow by one."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        lone = self.rows[0]
        generated = lone.out_ids if self.solo and self.steps <= CACHED_DECODE_STEPS else None
        self.cache, self.logits, self.shared = self.gen.decode_step(
            lone.req.input_ids, generated, tokens, self.mask, self.next_pos, (self.cache, self.shared)
        )
        self._take_routes(self.rows, 1)
        self.next_pos = self.next_pos + 1

    def _select(self, keep: list[int]) -> None:
        """Keep only the rows at positions `keep` (a batch of several rows: its cache is never shared)."""
        index = torch.tensor(keep, device=self.gen.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        self.sampler.select(keep)
        self.rows = [self.rows[i] for i in keep]

    def _take_routes(self, rows: list[Row], width: int, prefill: bool = False) -> None:
        """Append the last forward's routes to each row's: its prompt's columns of a left-padded prefill (`width`
        columns), else its one decoded token."""
        tap = self.gen.router_tap
        if tap is None:
            return
        taken = tap.take().cpu()
        taken = taken.view(len(rows), width, *taken.shape[1:])
        for i, row in enumerate(rows):
            row.routes.append(taken[i, width - len(row.req.input_ids) :] if prefill else taken[i])

    def _result(self, row: Row) -> GenerationResult:
        text = self.gen.final_text(row.req.params, row.out_ids, row.reason)
        routes = torch.cat(row.routes).to(torch.int32) if row.routes else None
        return GenerationResult(row.out_ids, row.out_lps, text, row.reason, row.cached, routes)
