"""The hf engine's fast decode state: a preallocated KV cache of slots written in place, and one decode step over it
(`SlotDecoder`), the step a CUDA graph replays on a GPU (`graphs.py`).

Layout, per layer: keys and values [C, kv heads, L, head dim] in the model's dtype (C slots, L columns). A row lives
in one slot; its fed tokens fill columns 0..n-1 (n = its length, `lengths[slot]`), so a text row's next position id
is its length. A decode step feeds every slot one token, writes its keys and values at column n (in place: no cache
grows, nothing is concatenated) and attends over columns 0..n (a mask built from `lengths` inside the step). A free
slot has length 0: it decodes whatever its token buffer holds at column 0, finite and ignored.

A step runs the first b slots (b: the power-of-two bucket above the highest slot in use) over the first w columns
(w: 256, 512, 1024, ... above the longest row, at most L), so one captured graph per (b, w) serves every step.
Rows join by copying their prefill's (left-padded) DynamicCache into free slots, and leave by freeing their slots:
no other row's keys move. C and L grow (a copy, and the graphs are captured again) when a join needs more slots or a
row more columns: L follows the same ladder, capped at the rows' prompt + max new tokens (rounded up to 256), so the
cache holds C x layers x 2 x kv heads x head dim x L x dtype bytes (Qwen3-1.7B in bf16: 112 KiB a column, 16 rows
of 1024 columns 1.75 GiB).

It applies where `unsupported` finds nothing: plain full-attention layers, an sdpa or eager attention, a model
whose forward takes the step's mask as it is (a per-layer-type mask mapping, as Qwen2 and Qwen3 take, or a 4-D mask,
which transformers' `create_causal_mask` returns unchanged, as Llama's forward calls it), no MoE route capture, no
batch-invariant mode and no vision tower.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable
from typing import Any, Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from slime.engine.hf.batch import joinable
from slime.engine.hf.graphs import DecodeGraphs
from slime.models.hf_model import text_config

logger = logging.getLogger(__name__)

LENGTH_STEP = 256  # columns: the smallest width, and the rounding of every length bound


def bucket(rows: int) -> int:
    """The power of two at or above `rows` (>= 1): the slot counts that get a graph."""
    return 1 << max(0, rows - 1).bit_length()


def width(columns: int) -> int:
    """The rung of the column ladder (256, 512, 1024, ...) at or above `columns`."""
    return max(LENGTH_STEP, bucket(columns))


def round_up(columns: int) -> int:
    return -(-columns // LENGTH_STEP) * LENGTH_STEP


def unsupported(model, *, capture_routes: bool, batch_invariant: bool, vision: Any) -> Optional[str]:
    """Why `model` cannot decode on slots with these generator options, or None."""
    config = text_config(model.config)
    if capture_routes or batch_invariant or vision is not None:
        return "route capture, batch-invariant mode and images decode on the dynamic cache"
    attention = getattr(config, "_attn_implementation", None) or "sdpa"
    if attention not in ("sdpa", "eager"):
        return f"attention {attention!r}: only sdpa and eager take the slots' mask"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or not joinable(DynamicCache(config=model.config)):
        return "only plain full-attention layers decode on slots"
    if mask_form(model) is None:
        return f"{type(model.base_model).__name__}'s forward takes neither a mask mapping nor a prepared 4-D mask"
    return None


def mask_form(model) -> Optional[str]:
    """How the model's forward takes a step's prepared mask: "mapping" ({"full_attention": mask}, which it uses
    as is), "4d" (a 4-D mask, which `create_causal_mask` returns unchanged), None where its source shows neither."""
    try:
        source = inspect.getsource(type(model.base_model).forward)
    except (OSError, TypeError):
        return None
    if "causal_mask_mapping := attention_mask" in source:
        return "mapping"
    return "4d" if "create_causal_mask(" in source else None


class SlotCache(Cache):
    """One step's transformers cache over the slots: `update` writes each row's new keys and values at its column
    and returns the layer's whole window. keys / values: per layer [b, kv heads, w, head dim] views of the slots;
    rows: arange(b); columns: [b] long, each row's write column (its length)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], rows: torch.Tensor, columns: torch.Tensor):
        # Cache's own constructor is not called: its per-layer objects differ between transformers versions and
        # `update` below replaces them
        self.layers = []
        self.slot_keys, self.slot_values, self.rows, self.columns = keys, values, rows, columns

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs=None):
        keys, values = self.slot_keys[layer_idx], self.slot_values[layer_idx]
        keys[self.rows, :, self.columns] = key_states[:, :, 0]
        values[self.rows, :, self.columns] = value_states[:, :, 0]
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # position ids are always passed; the model needs no count of its own


class SlotDecoder:
    """The slots of one generator, held by one batch at a time (`acquire` / `release`), see the module docstring.

    Args:
        model: the generator's causal LM (on its device, eval mode).
        cache_kwarg: the name of its forward's cache argument.
        graphs: replay each step as a CUDA graph (a CUDA model only); False: run it eagerly.
    """

    def __init__(self, model, *, cache_kwarg: str, graphs: bool):
        config = text_config(model.config)
        param = next(model.parameters())
        self.model, self.cache_kwarg, self.dtype, self.device = model, cache_kwarg, param.dtype, param.device
        self.layers = int(config.num_hidden_layers)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.boolean_mask = (getattr(config, "_attn_implementation", None) or "sdpa") == "sdpa"
        self.mask_mapping = mask_form(model) == "mapping"
        self.graphs = DecodeGraphs() if graphs else None
        self._owner: Optional[Callable[[], Any]] = None
        self.reset()

    def reset(self) -> None:
        """Free the slots' memory and graphs (kept while a live batch holds them: it decodes on)."""
        if self._owner is not None and self._owner() is not None:
            return
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = self.length = self.bound = 0  # slots, columns, the columns rows may need
        long = {"dtype": torch.long, "device": self.device}
        self.ids, self.lengths = torch.zeros(0, **long), torch.zeros(0, **long)
        self.host_lengths: list[int] = []  # `lengths` as known on the host (no sync to read it)
        self.rows = self.columns = None  # arange(capacity), arange(length)
        self.taken: set[int] = set()
        self._index_key, self._index = None, None
        if self.graphs is not None:
            self.graphs.clear()

    @property
    def memory_bytes(self) -> int:
        """Bytes the slots' keys and values hold."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def acquire(self, batch) -> bool:
        """Give the slots to `batch` (all free) unless another live batch holds them."""
        holder = self._owner() if self._owner is not None else None
        if holder is batch:
            return True
        if holder is not None:
            return False
        self._owner = weakref.ref(batch)
        self.free(sorted(self.taken))
        self.bound = 0
        return True

    def release(self, batch) -> None:
        """`batch` gives the slots back (its rows are done)."""
        if self._owner is not None and self._owner() is batch:
            self.free(sorted(self.taken))
            self._owner = None

    def free(self, slots: list[int]) -> None:
        """Free `slots`: their length goes back to 0 (a free slot writes at column 0)."""
        if slots:
            self.lengths[torch.tensor(slots, device=self.device)] = 0
        for slot in slots:
            self.taken.discard(slot)
            self.host_lengths[slot] = 0

    def load(self, cache: DynamicCache, mask: torch.Tensor, bound: int) -> list[int]:
        """Copy rows into free slots and return the slots (in row order). cache: [n, kv heads, W, head dim] per
        layer, each row's tokens right-aligned (left padding); mask: [n, W], 1 at the row's fed tokens; bound: the
        most tokens any of these rows will hold."""
        lengths = mask.sum(-1).tolist()
        slots = self._reserve(len(lengths))
        self.bound = max(self.bound, bound)
        self._fit(bucket(max(slots) + 1), max(lengths) + 1)
        columns = min(mask.shape[1], self.length)
        shift = mask.shape[1] - mask.sum(-1, keepdim=True)  # [n, 1] left-padding columns
        source = (torch.arange(mask.shape[1], device=mask.device) + shift) % mask.shape[1]
        source = source[:, None, :columns, None].expand(-1, self.kv_heads, -1, self.head_dim).to(self.device)
        index = torch.tensor(slots, device=self.device)
        for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
            cached = cache.layers[layer]
            keys[index, :, :columns] = cached.keys.gather(2, source)  # columns past a row's length: masked out
            values[index, :, :columns] = cached.values.gather(2, source)
        self.lengths[index] = torch.tensor(lengths, device=self.device)
        for slot, length in zip(slots, lengths):
            self.host_lengths[slot] = length
        return slots

    def _reserve(self, count: int) -> list[int]:
        slots, slot = [], 0
        while len(slots) < count:
            if slot not in self.taken:
                slots.append(slot)
            slot += 1
        self.taken.update(slots)
        return slots

    def _fit(self, capacity: int, columns: int) -> None:
        """Grow the slots to at least `capacity` rows and `columns` columns (copying what they hold)."""
        if capacity <= self.capacity and columns <= self.length:
            return
        length = self.length
        if columns > length:
            length = max(columns, min(width(columns), round_up(max(self.bound, columns))))
        capacity = max(capacity, self.capacity)
        shape = (capacity, self.kv_heads, length, self.head_dim)
        old = self.keys + self.values
        grown = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * self.layers)]
        for new, held in zip(grown, old):
            new[: held.shape[0], :, : held.shape[2]] = held
        self.keys, self.values = grown[: self.layers], grown[self.layers :]
        extra = capacity - self.capacity
        self.ids = torch.cat([self.ids, self.ids.new_zeros(extra)])
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(extra)])
        self.host_lengths += [0] * extra
        self.capacity, self.length = capacity, length
        self.rows, self.columns = torch.arange(capacity, device=self.device), torch.arange(length, device=self.device)
        if self.graphs is not None:
            self.graphs.clear()  # they read the old buffers

    def step(self, tokens: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """Feed `tokens` [B] (long) to the rows in `slots` (B of them, in row order); returns their logits [B, V]."""
        needed = max(self.host_lengths[slot] for slot in slots) + 1
        self._fit(self.capacity, needed)
        index = self._slot_index(slots)
        self.ids.index_copy_(0, index, tokens)
        key = (bucket(max(slots) + 1), min(self.length, width(needed)))
        logits = self._run(key).index_select(0, index)
        self.lengths.index_add_(0, index, torch.ones_like(index))
        for slot in slots:
            self.host_lengths[slot] += 1
        return logits

    def _run(self, key: tuple[int, int]) -> torch.Tensor:
        """The step of `key` (slot bucket, columns): its graph's replay, or run eagerly without graphs. A step that
        cannot be captured turns the graphs off (a warning says why) and runs eagerly: a capture that fails runs
        nothing, and the eager step writes what it would have."""
        if self.graphs is None:
            return self._forward(*key)
        try:
            return self.graphs.run(key, lambda: self._forward(*key))
        except RuntimeError as exc:
            logger.warning("the decode step could not be captured as a CUDA graph (%s): decoding without graphs", exc)
            self.graphs.clear()
            self.graphs = None
            return self._forward(*key)

    def _slot_index(self, slots: list[int]) -> torch.Tensor:
        key = tuple(slots)
        if key != self._index_key:
            self._index_key, self._index = key, torch.tensor(slots, device=self.device)
        return self._index

    def _forward(self, rows: int, columns: int) -> torch.Tensor:
        """One decode step of the first `rows` slots over their first `columns` columns: logits [rows, V]. Reads
        only the slots' buffers (`ids`, `lengths`), so a CUDA graph of it replays with whatever they hold."""
        lengths = self.lengths[:rows]
        visible = self.columns[:columns].unsqueeze(0) <= lengths.unsqueeze(1)  # [rows, columns]
        if self.boolean_mask:
            mask = visible
        else:
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)
        cache = SlotCache(
            [k[:rows, :, :columns] for k in self.keys],
            [v[:rows, :, :columns] for v in self.values],
            self.rows[:rows],
            lengths,
        )
        mask = mask[:, None, None, :]  # [rows, 1, 1, columns]
        out = self.model(
            input_ids=self.ids[:rows].unsqueeze(1),
            attention_mask={"full_attention": mask} if self.mask_mapping else mask,
            position_ids=lengths.unsqueeze(1),
            use_cache=True,
            **{self.cache_kwarg: cache},
        )
        return out.logits[:, -1, :]
