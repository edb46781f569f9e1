"""What a CUDA process holds at its peak: the live allocations at the moment the allocated bytes were highest,
grouped by where they were made. A diagnosis aid for the memory plan (`slime/plan/memory.py`): a bench worker
records the allocator's history from its start and writes this table (`tools/bench_train.py --memory-history DIR`).

    with recording(Path("out/fsdp_16k.txt")):   # CUDA work here
        ...

The table: one row per place (the innermost frame under slime/ or tools/, and the innermost frame overall), the
GiB it held at the peak and how many blocks, largest first.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

GIB = 1 << 30
MAX_ENTRIES = 4_000_000  # allocator events kept: a 1.7B-shape step makes well under a million


def _frame(frame: dict) -> str:
    return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}"


def place(frames: list[dict]) -> str:
    """Where an allocation was made, from its stack (innermost frame first): the project's innermost frame and the
    innermost frame overall."""
    if not frames:
        return "(no stack)"
    own = next((f for f in frames if "/slime/" in f["filename"] or "/tools/" in f["filename"]), None)
    inner = _frame(frames[0])
    return inner if own is None or own is frames[0] else f"{_frame(own)} <- {inner}"


def live_at_peak(events: list[dict]) -> tuple[int, dict[str, tuple[int, int]]]:
    """(peak allocated bytes, {place: (bytes, blocks)} live at that moment) from one device's allocator trace
    (`torch.cuda.memory._snapshot()["device_traces"][i]`: `alloc` and `free_completed` events with addr, size and
    frames). Allocations made before recording began are not in the trace and not counted."""
    live: dict[int, tuple[int, list[dict]]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, list[dict]]] = {}
    for event in events:
        action, addr = event["action"], event["addr"]
        if action == "alloc":
            live[addr] = (event["size"], event.get("frames", []))
            total += event["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)[0]
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, frames in at_peak.values():
        group = groups[place(frames)]
        group[0] += size
        group[1] += 1
    return peak, {key: (b, n) for key, (b, n) in groups.items()}


def table(peak: int, groups: dict[str, tuple[int, int]], rows: int = 25) -> str:
    """The largest `rows` places as text lines: GiB, blocks, place."""
    lines = [f"peak allocated {peak / GIB:.2f} GiB; live at the peak, by place:"]
    for key, (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])[:rows]:
        lines.append(f"{size / GIB:8.3f} GiB {count:6d} blocks  {key}")
    return "\n".join(lines)


@contextlib.contextmanager
def recording(out: Path) -> Iterator[None]:
    """Record the CUDA allocator's history (Python stacks) while the body runs, then write the peak's table to
    `out`."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        yield
    finally:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        device = torch.cuda.current_device()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table(*live_at_peak(snapshot["device_traces"][device])) + "\n")
