"""Curves of several runs in one picture: each run's metrics.jsonl, chosen keys against the rollout step.

    python tools/plot_runs.py --run fsdp=RUN_DIR --run megatron=RUN_DIR --key eval/arithmetic --out curves.png

A run is LABEL=PATH (a run directory holding metrics.jsonl, or the file itself); `eval/...` keys are drawn at
their eval steps. Exit 2 on a malformed --run or when no run logged any key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def metrics_file(path: str) -> Path:
    candidate = Path(path)
    return candidate / "metrics.jsonl" if candidate.is_dir() else candidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=PATH (run dir or metrics.jsonl)")
    parser.add_argument("--key", action="append", required=True, help="a metric key, e.g. eval/arithmetic")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.run:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            print(f"--run {item!r}: expected LABEL=PATH, e.g. --run fsdp=outputs/run_1", file=sys.stderr)
            return 2
        runs[label] = metrics_file(path)
    from slime.tracking.plot import plot_run_curves

    written = plot_run_curves(runs, args.out, keys=tuple(args.key), title=args.title or ", ".join(args.key))
    if written is None:
        print(f"no run logged any of {args.key} (looked in {', '.join(map(str, runs.values()))})", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
