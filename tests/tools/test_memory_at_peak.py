"""tools/memory_at_peak.py: the live allocations at the allocator's peak, grouped by where they were made."""

from __future__ import annotations

from tools.memory_at_peak import GIB, live_at_peak, place, table


def frames(*names: str) -> list[dict]:
    """A stack, innermost first, of (file, function) pairs like `file.py:fn`."""
    out = []
    for name in names:
        filename, function = name.split(":")
        out.append({"filename": filename, "line": 7, "name": function})
    return out


WEIGHTS = frames("/x/torch/nn/linear.py:__init__", "/repo/slime/train/fsdp/model.py:build")
ACTS = frames("/x/torch/nn/functional.py:silu", "/repo/slime/models/qwen3.py:mlp")
LOGITS = frames("/repo/slime/train/loss.py:logits")


def test_the_peak_is_the_highest_running_total_and_its_live_blocks_are_grouped_by_place():
    events = [
        {"action": "alloc", "addr": 1, "size": 4 * GIB, "frames": WEIGHTS},
        {"action": "alloc", "addr": 2, "size": 1 * GIB, "frames": ACTS},
        {"action": "alloc", "addr": 3, "size": 1 * GIB, "frames": ACTS},
        {"action": "free_requested", "addr": 2, "size": 1 * GIB},
        {"action": "free_completed", "addr": 2, "size": 1 * GIB},
        {"action": "alloc", "addr": 4, "size": 2 * GIB, "frames": LOGITS},  # peak: 4 + 1 + 2 = 7 GiB
        {"action": "free_completed", "addr": 4, "size": 2 * GIB},
        {"action": "free_completed", "addr": 3, "size": 1 * GIB},
        {"action": "alloc", "addr": 5, "size": 2 * GIB, "frames": ACTS},  # 6 GiB: below the peak
    ]
    peak, groups = live_at_peak(events)
    assert peak == 7 * GIB
    assert groups == {
        "model.py:7 build <- linear.py:7 __init__": (4 * GIB, 1),
        "qwen3.py:7 mlp <- functional.py:7 silu": (1 * GIB, 1),
        "loss.py:7 logits": (2 * GIB, 1),
    }
    lines = table(peak, groups).splitlines()
    assert lines[0] == "peak allocated 7.00 GiB; live at the peak, by place:"
    assert [line.split("GiB")[0].strip() for line in lines[1:]] == ["4.000", "2.000", "1.000"]


def test_a_free_of_a_block_allocated_before_recording_changes_nothing():
    events = [
        {"action": "free_completed", "addr": 9, "size": GIB},
        {"action": "alloc", "addr": 1, "size": GIB, "frames": []},
    ]
    assert live_at_peak(events) == (GIB, {"(no stack)": (GIB, 1)})


def test_a_stack_without_a_project_frame_is_named_by_its_innermost_frame():
    assert place(frames("/x/torch/a.py:f", "/x/torch/b.py:g")) == "a.py:7 f"
    assert place(LOGITS) == "loss.py:7 logits"
