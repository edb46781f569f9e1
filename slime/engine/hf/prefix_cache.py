"""The hf engine's prefix cache: the prefill of a prompt decoded alone, kept for the next request with
the same prompt (a group's n samples share one prompt).

A one-request batch's prefill is a pure function of the weights and the prompt (no padding, no
other rows), so reusing its result (the KV cache and the last position's logits) for the next
request with the same prompt is that same computation: outputs stay bit-identical, which is what
`rollout.deterministic` needs. This is SGLang's radix cache restricted to whole prompts; batched
prefills are never stored (a batch's row results depend on its other rows).

Entries are valid for the weights they were computed with: the server clears the cache on every
weight update, `/flush_cache` and memory release, as SGLang flushes its radix cache. Capacity is
counted in prompt tokens; the least recently used prompts go first.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import torch

DEFAULT_MAX_TOKENS = 8192  # prompt tokens; the tiny model's KV is 0.5 KiB a token, Qwen3-4B's (bf16) 144 KiB


@dataclass
class Prefill:
    """One prompt's prefill: the KV cache after it and the logits [1, V] at its last position."""

    cache: Any  # a transformers Cache (DynamicCache), never decoded into: callers get copies
    logits: torch.Tensor


class PrefixCache:
    """LRU map from a prompt (token ids) to its one-request `Prefill`, holding at most `max_tokens`
    prompt tokens (0 disables it)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max(0, int(max_tokens))
        self._entries: OrderedDict[tuple[int, ...], Prefill] = OrderedDict()
        self.tokens = 0  # prompt tokens held
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prompt: list[int]) -> Optional[Prefill]:
        """A private copy of `prompt`'s prefill (decoding may extend it), or None."""
        if not self.enabled:
            return None
        key = tuple(prompt)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return Prefill(copy.deepcopy(entry.cache), entry.logits.clone())

    def put(self, prompt: list[int], cache: Any, logits: torch.Tensor) -> None:
        """Store a copy of the prefill of `prompt` (call before decoding extends `cache`)."""
        key = tuple(prompt)
        if not self.enabled or len(key) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = Prefill(copy.deepcopy(cache), logits.clone())
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self.tokens -= len(old)

    def clear(self) -> None:
        """Drop every entry (the weights changed, or the memory is released)."""
        self._entries.clear()
        self.tokens = 0

    def stats(self) -> dict[str, int]:
        return {"prefix_cache_prompts": len(self._entries), "prefix_cache_tokens": self.tokens,
                "prefix_cache_hits": self.hits, "prefix_cache_misses": self.misses}
