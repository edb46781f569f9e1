"""The metric-history gate: every end-to-end learning run's figures against a committed baseline.

A learning test records its run's figures (`record(name, run_dir, proc)`) into the session's report, a JSON-lines
file (`SLIME_METRIC_REPORT`, set by tools/test.sh; else one file in the session's temporary cache). At the end of
CI tools/test.sh compares the report with `tests/metric_baseline.json` and fails on a figure past its tolerance,
printing the table (baseline, now, delta):

    python -m tests.helpers.metric_history check REPORT              # exit 1 on a regression or a missing run
    python -m tests.helpers.metric_history refresh REPORT [--reason "..."]   # asks for the reason without one

The figures of a run: `last3_reward` (mean raw reward of the last three rollout steps), `first_step_0_8` (the first
rollout step whose raw reward reached 0.8; null when none did), `max_logprob_diff` (the largest trainer-vs-engine
mean |log-prob difference| of any train step), `wall_s` (the run's own elapsed time, result.json) and `cpu_s` (CPU
seconds of the run's whole process tree: tests/helpers/runs.py samples it). Each figure's tolerance is in the
baseline file, so that loosening one is a reviewed change with its reason recorded.

CI machines differ in speed (one has been 1.5x slower than another), so the two timings are compared after scaling
by the machines' own speed: tools/test.sh first times a fixed single-core workload (`calibrate`, its seconds
recorded in the report as `machine_s`), a refresh keeps that figure beside each run's, and the gate compares
`now * baseline machine_s / this machine_s` with the baseline (a run without it: unscaled).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tests.helpers.compose import ROOT

REPORT_VAR = "SLIME_METRIC_REPORT"
BASELINE = ROOT / "tests" / "metric_baseline.json"
FIGURES = ("last3_reward", "first_step_0_8", "max_logprob_diff", "wall_s", "cpu_s")
TIMINGS = ("wall_s", "cpu_s")  # scaled by the machines' speed before they are judged
MACHINE = "machine_s"  # the report's and each baseline run's calibration: seconds of `machine_seconds()`
LOGPROB_DIFF = "train/train_rollout_logprob_abs_diff"
DEFAULT_TOLERANCES = {
    "last3_reward": {"lower_by": 0.1},  # a learning bar: 0.1 of reward down is a regression
    "first_step_0_8": {"later_by": 8, "missing": "regression"},
    "max_logprob_diff": {"ratio": 10.0, "floor": 1e-6},  # fp32 runs sit at 1e-7..1e-6
    "wall_s": {"ratio": 3.0},  # a CI machine has been 1.5x slower on some days, and runs share two cores
    "cpu_s": {"ratio": 2.0},
}


def report_path() -> Path:
    """tools/test.sh's report, or one in the session's cache (tests/conftest.py sets SLIME_CACHE_DIR)."""
    return Path(os.environ.get(REPORT_VAR) or Path(os.environ["SLIME_CACHE_DIR"]) / "metric_report.jsonl")


def figures_of(run_dir: Path, *, cpu_s: Optional[float] = None) -> dict[str, Any]:
    """The figures of a finished run from its metrics.jsonl and result.json."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [(r["rollout/step"], r["rollout/raw_reward"]) for r in records if "rollout/raw_reward" in r]
    diffs = [r[LOGPROB_DIFF] for r in records if LOGPROB_DIFF in r]
    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    last3 = [reward for _, reward in rewards[-3:]]
    return {
        "last3_reward": round(sum(last3) / len(last3), 4) if last3 else None,
        "first_step_0_8": next((step for step, reward in rewards if reward >= 0.8), None),
        "max_logprob_diff": max(diffs) if diffs else None,
        "wall_s": result.get("elapsed_s"),
        "cpu_s": None if cpu_s is None else round(cpu_s, 1),
    }


def record(name: str, run_dir: Path, proc: Any = None) -> dict[str, Any]:
    """Appends run `name`'s figures to the session's report (`proc`: the finished run, whose `cpu_s` the test
    helpers measured) and returns them. Call it before the test's own assertions, so a failing run is reported."""
    figures = figures_of(run_dir, cpu_s=getattr(proc, "cpu_s", None))
    _append(report_path(), {"run": name, **figures})
    return figures


def _append(report: Path, entry: dict[str, Any]) -> None:
    """One line of the report; runs of a pool finish in threads of one process, and two processes may write."""
    report.parent.mkdir(parents=True, exist_ok=True)
    with report.open("a") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(json.dumps(entry) + "\n")


def machine_seconds(repeats: int = 5) -> float:
    """Seconds this machine's core takes for a fixed workload of Python bytecode (the fastest of `repeats`, so that
    a busy moment does not count): the machine's speed, to compare timings measured on different machines."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        table: dict[int, float] = {}
        for i in range(1_500_000):
            table[i & 4095] = table.get(i & 4095, 0.0) * 0.5 + i % 7
        best = min(best, time.perf_counter() - start)
    return round(best, 4)


def calibrate(report: Path) -> float:
    """Time `machine_seconds()` and append it to the report (before the runs: an idle machine)."""
    seconds = machine_seconds()
    _append(report, {MACHINE: seconds})
    return seconds


def _entries(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def read_report(path: Path) -> dict[str, dict[str, Any]]:
    """run -> figures (a run recorded twice: its last record); each with the session's `machine_s` when the
    report holds one."""
    entries = _entries(path)
    machine = next((e[MACHINE] for e in reversed(entries) if MACHINE in e and "run" not in e), None)
    runs = {e["run"]: {k: e.get(k) for k in FIGURES} for e in entries if "run" in e}
    return {run: {**figures, MACHINE: machine} if machine else figures for run, figures in runs.items()}


@dataclasses.dataclass(frozen=True)
class Row:
    run: str
    figure: str
    baseline: Any
    now: Any
    verdict: str  # "ok", "regression", "missing" (a baseline run the report lacks), "new" (not in the baseline)
    scaled: Any = None  # a timing of `now` scaled to the baseline's machine (what was judged)


def _judge(figure: str, base: Any, now: Any, tolerance: dict[str, Any]) -> str:
    if base is None and now is None:
        return "ok"
    if now is None:
        return "regression" if tolerance.get("missing") == "regression" or figure == "last3_reward" else "ok"
    if base is None:
        return "ok"
    if "lower_by" in tolerance:
        return "regression" if now < base - tolerance["lower_by"] else "ok"
    if "later_by" in tolerance:
        return "regression" if now > base + tolerance["later_by"] else "ok"
    limit = base * tolerance["ratio"]
    return "regression" if now > max(limit, tolerance.get("floor", 0.0)) else "ok"


def compare(baseline: dict[str, Any], report: dict[str, dict[str, Any]]) -> list[Row]:
    tolerances = baseline.get("tolerances", DEFAULT_TOLERANCES)
    rows = []
    for run in sorted(set(baseline["runs"]) | set(report)):
        base, now = baseline["runs"].get(run), report.get(run)
        for figure in FIGURES:
            if base is None:
                rows.append(Row(run, figure, None, now.get(figure), "new"))
            elif now is None:
                rows.append(Row(run, figure, base.get(figure), None, "missing"))
            else:
                scaled = _scaled(figure, base, now)
                verdict = _judge(figure, base.get(figure), scaled, tolerances[figure])
                rows.append(Row(run, figure, base.get(figure), now.get(figure), verdict, scaled))
    return rows


def _scaled(figure: str, base: dict[str, Any], now: dict[str, Any]) -> Any:
    """`now`'s figure as the baseline's machine would have measured it (timings, where both machines were timed)."""
    value, theirs, ours = now.get(figure), base.get(MACHINE), now.get(MACHINE)
    if figure not in TIMINGS or value is None or not theirs or not ours:
        return value
    return round(value * theirs / ours, 2)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def _delta(row: Row) -> str:
    if not all(isinstance(v, (int, float)) for v in (row.baseline, row.now)):
        return ""
    delta = row.now - row.baseline
    if not row.baseline or row.figure not in TIMINGS:
        return f"{delta:+.3g}"
    scaled = row.scaled if row.scaled is not None else row.now
    on_theirs = f", x{scaled / row.baseline:.2f} on the baseline's machine" if scaled != row.now else ""
    return f"{delta:+.3g} (x{row.now / row.baseline:.2f}{on_theirs})"


def render(rows: list[Row]) -> str:
    table = [("run", "figure", "baseline", "now", "delta", "")]
    table += [(r.run, r.figure, _cell(r.baseline), _cell(r.now), _delta(r), r.verdict.upper()) for r in rows]
    table = [tuple("" if cell == "OK" else cell for cell in line) for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def check(report: Path, baseline_path: Path = BASELINE) -> int:
    """Prints the table; 1 when a figure regressed or a baseline run is missing (or no baseline exists), else 0."""
    if not baseline_path.exists():
        print(f"metric history: FAILED: no baseline at {baseline_path}; make it from this run's report:\n"
              f"{_refresh_command(report)}")  # fmt: skip
        return 1
    now = read_report(report)
    rows = compare(json.loads(baseline_path.read_text()), now)
    print(f"metric history: the learning runs' figures against {baseline_path}")
    machine = next((figures.get(MACHINE) for figures in now.values()), None)
    print(f"machine: {machine} s for the calibration (timings are judged scaled to the baseline's machine)"
          if machine else "machine: not calibrated (timings are judged as measured)")  # fmt: skip
    print(render(rows))
    bad = sorted({(r.run, r.figure) for r in rows if r.verdict in ("regression", "missing")})
    if bad:
        names = ", ".join(f"{run}: {figure}" for run, figure in bad)
        print(f"metric history: FAILED ({names}); if the change is intended, refresh the baseline:\n"
              f"{_refresh_command(report)}")  # fmt: skip
        return 1
    if any(r.verdict == "new" for r in rows):
        print("metric history: runs not in the baseline yet (refresh to add them)")
    return 0


def _refresh_command(report: Path) -> str:
    return f"  python -m tests.helpers.metric_history refresh {report} --reason '...'"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def refresh(report: Path, reason: str, baseline_path: Path = BASELINE) -> dict[str, Any]:
    """The baseline with the report's figures for every run it holds, the reason recorded in its history."""
    if not reason.strip():
        raise SystemExit("refresh: a reason is required (what changed, and why the new figures are right)")
    baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else {"runs": {}, "history": []}
    baseline.setdefault("tolerances", DEFAULT_TOLERANCES)
    now = read_report(report)
    if not now:
        raise SystemExit(f"refresh: {report} holds no run")
    baseline["runs"].update(now)
    today = datetime.date.today().isoformat()
    baseline.setdefault("history", []).append(
        {"date": today, "commit": _commit(), "runs": sorted(now), "reason": reason.strip()}
    )
    baseline_path.write_text(json.dumps(baseline, indent=2, sort_keys=False) + "\n")
    return baseline


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.metric_history")
    sub = parser.add_subparsers(dest="command", required=True)
    calibrate_cmd = sub.add_parser("calibrate", help="time this machine's core, into the report")
    calibrate_cmd.add_argument("report", type=Path)
    check_cmd = sub.add_parser("check", help="compare a report with the baseline (exit 1 on a regression)")
    check_cmd.add_argument("report", type=Path)
    refresh_cmd = sub.add_parser("refresh", help="take a report's figures into the baseline, with a reason")
    refresh_cmd.add_argument("report", type=Path)
    refresh_cmd.add_argument("--reason", default=None)
    for cmd in (check_cmd, refresh_cmd):
        cmd.add_argument("--baseline", type=Path, default=BASELINE)
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        print(f"metric history: this machine's calibration took {calibrate(args.report)} s")
        return 0
    if args.command == "check":
        return check(args.report, args.baseline)
    reason = args.reason if args.reason is not None else input("Why do these figures become the baseline? ")
    refresh(args.report, reason, args.baseline)
    print(f"{args.baseline}: {len(read_report(args.report))} runs refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
