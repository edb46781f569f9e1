"""Do two runs log the same numbers? Compare the metrics.jsonl of two run directories, timings aside.

    python tools/compare_metrics.py RUN_A RUN_B [--first N]

RUN_A and RUN_B are run directories (each holding metrics.jsonl) or the files themselves. Records are compared
in order, key by key and exactly; keys that measure time or depend on scheduling are left out (TIMING_MARKERS:
wall-clock times and the rates over them (tokens/s, TFLOP/s, MFU), the over-sampling counters of a dynamic
filter, whose in-flight requests at the cut depend on timing, and the weight probe's log-prob difference, scored in
whatever batch the engine is running). Prints one line per differing value and a summary; exit 0 identical, 1 different,
2 bad arguments. Holds a refactor to "the same first N rollouts" (e.g. each algorithm's embedded run before and
after it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# rates divide by a time (tflops, mfu) and vary as much; the weight probe is scored in whatever batch the engine runs
# at that moment (its float sums follow the batch's shape), so its last digits vary from run to run
TIMING_MARKERS = (
    "time",
    "per_s",
    "_at",
    "seconds",
    "duration",
    "tflops",
    "mfu",
    "rollout_tokens",
    "aborted_samples",
    "weight_probe_logprob_diff",
)


def is_timing(key: str) -> bool:
    return any(marker in key.lower() for marker in TIMING_MARKERS)


def load_records(path: Path, first: int | None) -> list[dict]:
    """metrics.jsonl's records (the first `first` rollout steps when given), timing keys dropped."""
    records = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if first is not None and record.get("rollout/step", 0) >= first:
            continue
        records.append({key: value for key, value in record.items() if not is_timing(key)})
    return records


def differences(a: list[dict], b: list[dict]) -> list[str]:
    """Human-readable differences between two record lists (empty: identical)."""
    found = [f"{len(a)} records vs {len(b)}"] if len(a) != len(b) else []
    for index, (x, y) in enumerate(zip(a, b)):
        for key in sorted(x.keys() | y.keys()):
            if x.get(key, "<absent>") != y.get(key, "<absent>"):
                found.append(f"record {index} {key}: {x.get(key, '<absent>')} vs {y.get(key, '<absent>')}")
    return found


def metrics_file(path: str) -> Path:
    candidate = Path(path)
    candidate = candidate / "metrics.jsonl" if candidate.is_dir() else candidate
    if not candidate.is_file():
        raise SystemExit(f"compare_metrics: no metrics.jsonl at {path}")
    return candidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--first", type=int, default=None, help="compare only rollout steps below this")
    args = parser.parse_args(argv)
    try:
        a, b = (load_records(metrics_file(p), args.first) for p in (args.run_a, args.run_b))
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    found = differences(a, b)
    for line in found:
        print(line)
    print(f"{len(a)} records: " + ("identical (timings aside)" if not found else f"{len(found)} differences"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
