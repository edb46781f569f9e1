"""Per-rollout wall time of the one-step-async loop against the synchronous loop, on the same config.

Runs `python main.py` twice in this process's sequence — train.async=false, then train.async=true — with the
same overrides (the embedded default unless given), and prints one table: per-rollout wall time (mean
perf/step_time: a step's wall time from waiting for its rollout to its log, so the steps add up to the
loop), the same without the first step (no overlap is possible there), the rollout and train phase means,
the step time beyond the rollout's (what the overlap can hide: train, sync, logging),
how much generation ran during training, staleness, the last-3 mean raw reward, and each mode's ratio
to the synchronous baseline measured in the same invocation:

    python tools/bench_async.py                                  # the embedded default, 60 rollout steps
    python tools/bench_async.py train.num_rollout=10             # any main.py overrides, for both runs
    python tools/bench_async.py --out /tmp/bench rollout.weight_sync.interval=2   # (async run only)
    python tools/bench_async.py --repeats 3 train.num_rollout=20   # sync, async, sync, ...: medians per mode

On a busy machine the repeats alternate the modes, so load drifting during the benchmark hits both; each
mode's row is then the per-run median of every column.

Overrides starting with rollout.weight_sync.interval go to the async run only (the synchronous loop
refuses an interval > 1). Run directories land under --out (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASYNC_ONLY = ("rollout.weight_sync.interval=",)


def run_mode(run_dir: Path, overrides: list[str], *, is_async: bool) -> tuple[list[dict], float]:
    """main.py in `run_dir`; returns (its per-rollout metric records, its wall time in s)."""
    extra = [o for o in overrides if is_async or not o.startswith(ASYNC_ONLY)]
    cmd = [sys.executable, "main.py", f"hydra.run.dir={run_dir}", "logger.progress=false"]
    cmd += [f"train.async={str(is_async).lower()}", *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "perf/step_time" in r], wall


def summarise(rows: list[dict], wall: float) -> dict[str, float]:
    """Seconds per rollout step and the run's outcome, from its per-rollout records."""
    mean = lambda key, rs=rows: statistics.fmean(r.get(key, 0.0) for r in rs)  # noqa: E731
    rewards = [r["rollout/raw_reward"] for r in rows]
    return {
        "steps": float(len(rows)),
        "step_s": mean("perf/step_time"),
        "step_s_after_first": mean("perf/step_time", rows[1:]) if len(rows) > 1 else float("nan"),
        "loop_s": sum(r["perf/step_time"] for r in rows),
        "rollout_s": mean("perf/rollout_time"),
        "beyond_rollout_s": mean("perf/step_time") - mean("perf/rollout_time"),
        "train_s": mean("perf/train_time"),
        "overlap_s": mean("perf/rollout_overlap_time"),
        "staleness": mean("rollout/staleness_mean"),
        "last3_reward": statistics.fmean(rewards[-3:]),
        "wall_s": wall,
    }


def table(results: dict[str, dict[str, float]]) -> str:
    base = results["sync"]
    cols = ["steps", "step_s", "step_s_after_first", "loop_s", "rollout_s", "beyond_rollout_s", "train_s", "overlap_s"]
    cols += ["staleness"]
    cols += ["last3_reward", "wall_s"]
    lines = [f"{'mode':<6} " + " ".join(f"{c:>18}" for c in cols) + f" {'step_s vs sync':>15}"]
    for mode, r in results.items():
        cells = " ".join(f"{r[c]:>18.3f}" for c in cols)
        lines.append(f"{mode:<6} {cells} {r['step_s'] / base['step_s']:>15.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="directory for the two run directories")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, alternating sync and async")
    parser.add_argument("overrides", nargs="*", help="main.py overrides for both runs")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_async_"))
    runs: dict[str, list[dict[str, float]]] = {"sync": [], "async": []}
    for repeat in range(args.repeats):
        for mode in runs:
            rows, wall = run_mode(out / f"{mode}_{repeat}", args.overrides, is_async=mode == "async")
            runs[mode].append(summarise(rows, wall))
            print(f"{mode} #{repeat}: {len(rows)} steps, {runs[mode][-1]['step_s']:.3f} s/step", flush=True)
    results = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    print(f"overrides: {' '.join(args.overrides) or '(embedded default)'}; {args.repeats} run(s) per mode in {out}")
    print(table(results))
    (out / "bench_async.json").write_text(json.dumps({"median": results, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
