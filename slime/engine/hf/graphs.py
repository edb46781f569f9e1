"""CUDA graphs of the hf engine's decode step (`static_cache.SlotDecoder`): one graph per key (slot bucket,
column width), captured the first time that key runs, then replayed. The captured function reads and writes only
buffers that outlive it (the slots' token ids, lengths and keys / values), so a replay is the whole step: one
launch instead of a forward pass's hundreds of kernels and its Python."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

WARMUP_RUNS = 2  # eager runs before a capture (lazy initialisation, cuBLAS workspaces), as torch's docs advise


class DecodeGraphs:
    """The captured steps of one `SlotDecoder`. Graphs share one memory pool: they never run at once, and each
    output is copied out before the next replay."""

    def __init__(self):
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`step()`'s output after replaying its graph for `key` (captured from `step` on first use). The output
        tensor is the graph's own: the next replay of any graph may overwrite it."""
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(step)
        graph, out = entry
        graph.replay()
        return out

    def _capture(self, step: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # the warm-up runs compute what the replay right after capture computes (same buffers), so their writes
        # to the cache are the step's own
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the server's other threads may query the device (memory stats) during a capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = step()
        return graph, out

    def clear(self) -> None:
        """Drop every graph (the buffers they read were replaced, or the memory is released)."""
        self._graphs.clear()
        self._pool = None
