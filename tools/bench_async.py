"""The training loops (`train.async`: off, one_step, full) on the embedded default with a long tail of response
lengths (recipe=digit_long_tail: one sample in 16 decodes 20 tokens instead of 2) and the engine decoding requests
together (rollout.deterministic=false), so a rollout step waits on its few long samples after the rest are done.

Runs `python main.py` once per mode (one subprocess each, its own hydra.run.dir under --out), reads each run's
metrics.jsonl and prints one table: s per trained step (the loop's wall time, i.e. the last step's
perf/train_ended_at since the loop began, over the steps), its ratio to off's measured in the same invocation, the
mean perf/step_time and perf/rollout_time, the last-3 mean rollout/raw_reward, the mean trainer and engine idle time
per step (perf/trainer_idle_time, perf/engine_idle_time) and the buffer depth (rollout/buffer_depth) where the
loop logs them, and the staleness (mean of rollout/staleness_mean, max of rollout/staleness_max):

    python tools/bench_async.py                                      # off, one_step, full; 60 rollout steps each
    python tools/bench_async.py --modes off,one_step --num-rollout 20
    python tools/bench_async.py --extra rollout.weight_sync.interval=2    # (one_step only)
    python tools/bench_async.py --extra rollout.generate_function=null --extra rollout.deterministic=true
                                                                     # the plain embedded task, deterministic
    python tools/bench_async.py --repeats 3 --num-rollout 20         # off, one_step, full, off, ...: medians

A mode the config refuses (exit 2 with a configuration error: full before its loop exists) is reported "not
available" and the others still run; any other failure, or a run past --timeout s (default 1800; then SIGTERM,
main.py's graceful teardown), is reported "failed" and makes the exit status 1. A full run
that logs no rollout/buffer_depth is flagged: it ran, but not the fully asynchronous loop.

Each mode adds its keys: one_step and full need engines of their own (cluster.colocate=false), full bounds the
staleness (train.max_staleness=1). --extra overrides (and bare ones after the options) go to every run, after the
mode's; rollout.weight_sync.interval only to one_step (the others refuse an interval > 1). On a busy machine
--repeats alternates the modes, so load drifting during the benchmark hits all of them; each row is then the
per-run median of every column.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slime.config.async_mode import AsyncMode
from slime.tracking.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
BASE = ["recipe=digit_long_tail", "rollout.deterministic=false", "logger.progress=false"]
# train.async's modes (slime.config.async_mode), in their order, with what each needs besides
MODE_OVERRIDES = {
    mode.value: [f"train.async={mode.value}", *extra]
    for mode, extra in (
        (AsyncMode.OFF, []),
        (AsyncMode.ONE_STEP, ["cluster.colocate=false"]),
        (AsyncMode.FULL, ["train.max_staleness=1", "cluster.colocate=false"]),
    )
}
ONE_STEP_ONLY = ("rollout.weight_sync.interval=",)
TEARDOWN_S = 60  # s a timed-out run gets to tear down after SIGTERM
CONFIG_EXIT = 2  # main.py's exit status for a configuration error
FULL_ONLY_METRIC = "rollout/buffer_depth"
OK, NOT_AVAILABLE, FAILED = "ok", "not available", "failed"
# column -> (header, format); a missing value prints "-"
COLUMNS = {
    "s_per_step": ("s/step", "{:.3f}"),
    "ratio": ("vs off", "{:.3f}"),
    "step_time": ("step_time", "{:.3f}"),
    "rollout_time": ("rollout", "{:.3f}"),
    "last3_reward": ("reward", "{:.3f}"),
    "trainer_idle": ("trainer idle", "{:.3f}"),
    "engine_idle": ("engine idle", "{:.3f}"),
    "buffer_depth": ("buffer", "{:.1f}"),
    "staleness_mean": ("stale mean", "{:.2f}"),
    "staleness_max": ("stale max", "{:.0f}"),
    "steps": ("steps", "{:.0f}"),
}


def run_overrides(mode: str, extra: list[str], num_rollout: int | None) -> list[str]:
    """main.py's overrides for `mode`: the bench's, the mode's, then the user's (the last of a key wins)."""
    length = [f"train.num_rollout={num_rollout}"] if num_rollout is not None else []
    extra = [o for o in extra if mode == "one_step" or not o.startswith(ONE_STEP_ONLY)]
    return [*BASE, *length, *MODE_OVERRIDES[mode], *extra]


def run_main(
    run_dir: Path, overrides: list[str], timeout_s: float | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """main.py with `overrides` in `run_dir`; (the finished process, its wall time in s). Past `timeout_s` it gets
    SIGTERM, main.py's graceful teardown (its Ray daemons and engines with it), and SIGKILL 60 s later."""
    cmd = [sys.executable, "main.py", f"hydra.run.dir={run_dir}", *overrides]
    started = time.monotonic()
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=TEARDOWN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            err += f"\ntimed out after {timeout_s:.0f} s"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.monotonic() - started


def step_records(run_dir: Path) -> list[dict]:
    """One record per rollout step (those with perf/step_time; trainer records hold the optimizer steps)."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "perf/step_time" in r]


def mean_of(rows: list[dict], key: str) -> float | None:
    """Mean of `key` over the rows that log it; None where none does."""
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def loop_wall(rows: list[dict]) -> float:
    """The training loop's wall time (s): its last step's train end, else the steps' times added up."""
    ends = [r["perf/train_ended_at"] for r in rows if "perf/train_ended_at" in r]
    return max(ends) if ends else sum(r["perf/step_time"] for r in rows)


def summarise(rows: list[dict]) -> dict[str, float | None]:
    """One run's columns (seconds per rollout step, rewards, idle times, staleness in weight versions)."""
    stale_max = [r["rollout/staleness_max"] for r in rows if "rollout/staleness_max" in r]
    return {
        "steps": float(len(rows)),
        "s_per_step": loop_wall(rows) / len(rows),
        "step_time": mean_of(rows, "perf/step_time"),
        "rollout_time": mean_of(rows, "perf/rollout_time"),
        "last3_reward": statistics.fmean(r["rollout/raw_reward"] for r in rows[-3:]),
        "trainer_idle": mean_of(rows, "perf/trainer_idle_time"),
        "engine_idle": mean_of(rows, "perf/engine_idle_time"),
        "buffer_depth": mean_of(rows, FULL_ONLY_METRIC),
        "staleness_mean": mean_of(rows, "rollout/staleness_mean"),
        "staleness_max": max(stale_max) if stale_max else None,
    }


def is_config_error(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode == CONFIG_EXIT and "Configuration error" in proc.stderr + proc.stdout


def bench_mode(mode: str, run_dir: Path, overrides: list[str], timeout_s: float | None = None) -> dict:
    """Run one mode: {status, columns (when ok), note, wall_s}."""
    proc, wall = run_main(run_dir, overrides, timeout_s)
    result = {"mode": mode, "status": OK, "note": "", "wall_s": wall, "run_dir": str(run_dir)}
    if proc.returncode != 0:
        refused = mode == "full" and is_config_error(proc)
        result["status"] = NOT_AVAILABLE if refused else FAILED
        result["note"] = last_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"
        if not refused:
            print(f"{mode}: main.py {' '.join(overrides)} exited {proc.returncode}:\n{proc.stderr[-3000:]}", flush=True)
        return result
    rows = step_records(run_dir)
    if not rows:
        return {**result, "status": FAILED, "note": "no rollout step in metrics.jsonl"}
    result["columns"] = summarise(rows)
    if mode == "full" and result["columns"]["buffer_depth"] is None:
        result["note"] = f"no {FULL_ONLY_METRIC}: not the fully async loop?"
    return result


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:120] if lines else ""


def median_columns(runs: list[dict]) -> dict[str, float | None]:
    """Per column, the median over the runs that have it."""
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    return out


def combine(mode: str, results: list[dict]) -> dict:
    """A mode's row from its repeats: ok only if every repeat was; the columns' medians."""
    bad = [r for r in results if r["status"] != OK]
    if bad:
        return {"mode": mode, "status": bad[0]["status"], "note": bad[0]["note"]}
    note = next((r["note"] for r in results if r["note"]), "")
    return {"mode": mode, "status": OK, "note": note, "columns": median_columns([r["columns"] for r in results])}


def add_ratios(rows: list[dict]) -> None:
    """Each ok row's s/step over off's (None without an ok off row)."""
    base = next((r for r in rows if r["mode"] == "off" and r["status"] == OK), None)
    for row in rows:
        if row["status"] == OK:
            row["columns"]["ratio"] = row["columns"]["s_per_step"] / base["columns"]["s_per_step"] if base else None


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width table; a row that did not run says why in place of its columns."""
    widths = {key: max(len(header), 7) for key, (header, _) in COLUMNS.items()}
    lines = [f"{'mode':<9}" + "".join(f" {COLUMNS[k][0]:>{w}}" for k, w in widths.items()) + "  note"]
    for row in rows:
        if row["status"] != OK:
            lines.append(f"{row['mode']:<9} {row['status']}: {row['note']}")
            continue
        cols = row["columns"]
        cells = "".join(f" {cell(cols.get(k), COLUMNS[k][1]):>{w}}" for k, w in widths.items())
        lines.append(f"{row['mode']:<9}{cells}  {row['note']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="off,one_step,full", help="comma-separated train.async modes, in order")
    parser.add_argument("--num-rollout", type=int, default=None, help="rollout steps per run (default: 60)")
    parser.add_argument("--extra", action="append", default=[], help="a main.py override for every run (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, the modes alternating")
    parser.add_argument("--timeout", type=float, default=1800, help="s a run may take (then SIGTERM: failed)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the run directories (default: temp)")
    parser.add_argument("overrides", nargs="*", help="more main.py overrides for every run")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODE_OVERRIDES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {sorted(MODE_OVERRIDES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_async_"))
    extra = [*args.extra, *args.overrides]
    results: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    for repeat in range(args.repeats):
        for mode in args.modes:
            overrides = run_overrides(mode, extra, args.num_rollout)
            result = bench_mode(mode, out / f"{mode}_{repeat}", overrides, args.timeout)
            results[mode].append(result)
            print(f"{mode} #{repeat}: {result['status']}, {result['wall_s']:.0f} s {result['note']}", flush=True)
    rows = [combine(mode, rs) for mode, rs in results.items()]
    add_ratios(rows)
    print(f"overrides: {' '.join(BASE + extra)}; {args.repeats} run(s) per mode in {out}")
    print(table(rows))
    (out / "bench_async.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=2))
    return 1 if any(r["status"] == FAILED for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
