"""The hf engine's prefix cache: the prefill of a prompt decoded alone, and the decode step of its
first generated token, kept for the next request that gets there (a group's n samples share one
prompt and, once the policy is confident, their first token).

A one-request batch's forward passes are a pure function of the weights and the tokens fed so far
(no padding, no other rows), so reusing a stored result (the KV cache and the last position's
logits) is that same computation: outputs stay bit-identical, which is what `rollout.deterministic`
needs. This is SGLang's radix cache restricted to whole prompts and their first generated token
(later positions rarely coincide, and storing each would copy the growing KV cache at every step);
batched passes are never stored (a batch's row results depend on its other rows).

Entries are shared, not copied: `get` hands out the stored cache and `put` keeps the caller's, and the generator
deep-copies a cache only before a forward would extend it (a request that finishes on cached logits, as a
group's short answers mostly do, copies nothing).

Entries are valid for the weights they were computed with: the server clears the cache on every
weight update, `/flush_cache` and memory release, as SGLang flushes its radix cache. Capacity is
counted in prompt tokens; the least recently used prompts go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

DEFAULT_MAX_TOKENS = 8192  # tokens; the tiny model's KV is 0.5 KiB a token, Qwen3-4B's (bf16) 144 KiB
CACHED_DECODE_STEPS = 1  # decode states kept per prompt path: the first generated token's


@dataclass
class Prefill:
    """A prompt's prefill (or a decode step after it): the KV cache after it and the logits [1, V] at
    its last position."""

    cache: Any  # a transformers Cache (DynamicCache), shared: copy it before decoding into it
    logits: torch.Tensor  # never written to


class PrefixCache:
    """LRU map from (prompt, tokens generated after it) to the one-request `Prefill` there, holding at
    most `max_tokens` tokens (0 disables it)."""

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

    def get(self, prompt: list[int], generated: Sequence[int] = ()) -> Optional[Prefill]:
        """The stored state after `prompt` and `generated` (its cache is shared: copy before extending), or None."""
        if not self.enabled:
            return None
        key = (tuple(prompt), tuple(generated))
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry

    def put(self, prompt: list[int], cache: Any, logits: torch.Tensor, generated: Sequence[int] = ()) -> None:
        """Keep the state after `prompt` and `generated`; `cache` is shared from then on (the caller copies it
        before extending it)."""
        key = (tuple(prompt), tuple(generated))
        size = len(key[0]) + len(key[1])
        if not self.enabled or size > self.max_tokens or key in self._entries:
            return
        self._entries[key] = Prefill(cache, logits)
        self.tokens += size
        while self.tokens > self.max_tokens:
            (old_prompt, old_generated), _ = self._entries.popitem(last=False)
            self.tokens -= len(old_prompt) + len(old_generated)

    def clear(self) -> None:
        """Drop every entry (the weights changed, or the memory is released)."""
        self._entries.clear()
        self.tokens = 0

    def stats(self) -> dict[str, int]:
        return {
            "prefix_cache_entries": len(self._entries),
            "prefix_cache_tokens": self.tokens,
            "prefix_cache_hits": self.hits,
            "prefix_cache_misses": self.misses,
        }
