"""What a person sees of `python main.py`: on a terminal (a real pseudo-terminal, replayed as a terminal shows it)
and redirected to files, in the plain console and in logger.console=verbose (slime/driver/console.py's rule)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers.compose import ROOT
from tests.helpers.processes import TEST_RUN_VAR, assert_no_run_processes
from tests.helpers.runs import main_argv, run_concurrently, selected_runs
from tests.helpers.terminal import Screen, run_in_terminal

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
STEPS = 3
STEP_LINE = re.compile(rf"^rollout +\d+/{STEPS}  reward \d\.\d{{3}}  pg_loss [+-]\d\.\d{{4}}  \d+\.\d\ds/step$")
# What the plain console keeps off the terminal: log records, the phases' lines, the workers' and libraries' output
NOT_ON_A_PLAIN_TERMINAL = (
    "[INFO]",
    "] - phase ",
    " done in ",
    "pid=",
    "Loading weights",
    "Writing model shards",
    "Token authentication",
)


def _environment(run_dir: Path) -> dict[str, str]:
    """The session's environment without what overrides rich's reading of the terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    return {**env, TEST_RUN_VAR: str(run_dir)}


def _in_terminal(run_dir: Path, *overrides: str) -> tuple[int, list[str]]:
    """main.py on a pseudo-terminal (a fresh asset cache: the driver writes the model, as on a first run)."""
    env = {**_environment(run_dir), "SLIME_CACHE_DIR": str(run_dir.parent / f"{run_dir.name}_cache")}
    argv = main_argv(run_dir, f"train.num_rollout={STEPS}", *overrides, progress=True)
    code, raw = run_in_terminal(argv, cwd=ROOT, env=env, columns=120, rows=40, timeout=900)
    return code, Screen(raw, columns=120).lines


def _redirected(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    argv = main_argv(run_dir, *overrides, progress=True, tracked=True)
    return subprocess.run(argv, cwd=ROOT, env=_environment(run_dir), capture_output=True, text=True, timeout=900)


JOBS = {
    "terminal": lambda run_dir: _in_terminal(run_dir),
    "terminal_verbose": lambda run_dir: _in_terminal(run_dir, "logger.console=verbose"),
    "redirected": lambda run_dir: _redirected(run_dir, f"train.num_rollout={STEPS}"),
    "redirected_verbose": lambda run_dir: _redirected(run_dir, "train.num_rollout=1", "logger.console=verbose"),
}
RUN_OF_TEST = {
    "test_on_a_terminal_the_plan_then_one_display_and_no_log_line": "terminal",
    "test_verbose_on_a_terminal_prints_every_record_above_the_display": "terminal_verbose",
    "test_redirected_stdout_is_the_report_and_one_line_per_rollout_step": "redirected",
    "test_verbose_redirected_puts_the_config_on_stdout_and_the_records_on_stderr": "redirected_verbose",
}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    wanted = selected_runs(request, lambda test: RUN_OF_TEST.get(test.originalname))
    jobs = {key: functools.partial(job, root / key) for key, job in JOBS.items() if key in wanted}
    results = run_concurrently(jobs)
    return {key: (root / key, result) for key, result in results.items()}


def _bars(lines: list[str]) -> list[str]:
    """The lines of the live display's bar over the rollout steps."""
    return [line for line in lines if re.match(rf"^rollout [━╺╸ ]+ \d+/{STEPS} \d+:\d\d:\d\d", line)]


def test_on_a_terminal_the_plan_then_one_display_and_no_log_line(runs):
    run_dir, (code, lines) = runs["terminal"]
    assert code == 0, "\n".join(lines[-60:])
    steps = [i for i, line in enumerate(lines) if STEP_LINE.match(line)]
    assert len(steps) == STEPS, lines
    assert steps[0] <= 40, lines[: steps[0]]  # the plan summary, nothing else, before the first step
    assert lines[0].startswith("Run: grpo on tiny_qwen3") and len([x for x in lines[: steps[0]] if x]) <= 30
    bars = _bars(lines)
    assert len(bars) == 1 and f" {STEPS}/{STEPS} " in bars[0] and bars[0].endswith(" done"), bars
    assert lines.index(bars[0]) > steps[-1]  # the display under the step lines, the summary under it
    assert lines[lines.index(bars[0]) + 1].startswith(f"last step: rollout {STEPS - 1}  reward ")
    assert not [line for line in lines if any(text in line for text in NOT_ON_A_PLAIN_TERMINAL)], lines
    summary = lines[lines.index(bars[0]) + 2 :]
    assert summary[0].startswith("=====") and summary[1].startswith(f"Run completed: {STEPS} rollout steps")
    log = (run_dir / "main.log").read_text()  # what the terminal did not show
    assert "phase prepare started" in log and f"phase train (rollout {STEPS - 1}) done in" in log
    assert_no_run_processes()


def test_verbose_on_a_terminal_prints_every_record_above_the_display(runs):
    run_dir, (code, lines) = runs["terminal_verbose"]
    assert code == 0, "\n".join(lines[-60:])
    assert any(line.startswith("Resolved config (saved to ") for line in lines)
    assert "Derived values:" in lines
    records = [line for line in lines if "][slime.driver.driver][INFO] - phase " in line]
    assert len(records) >= 8 * STEPS and all(line.startswith("[20") for line in records), records
    worker = [line for line in lines if line.startswith("(FSDPBackend(rank=0) pid=")]  # a worker's output, verbatim
    assert worker and "Loading weights" in (run_dir / "logs" / "workers.log").read_text()
    # no log record, worker line or step line drawn across the display
    bars = _bars(lines)
    assert bars and not [bar for bar in bars if re.search(r"\[INFO\]|pid=|\] - phase |reward", bar)], bars
    assert len([line for line in lines if STEP_LINE.match(line)]) == STEPS
    assert_no_run_processes()


def test_redirected_stdout_is_the_report_and_one_line_per_rollout_step(runs):
    run_dir, proc = runs["redirected"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    steps = [i for i, line in enumerate(lines) if STEP_LINE.match(line)]
    assert [int(lines[i].split()[1].split("/")[0]) for i in steps] == list(range(STEPS))
    assert steps == list(range(steps[0], steps[0] + STEPS))  # one after the other: nothing between the steps
    plan, summary = lines[: steps[0]], lines[steps[-1] + 1 :]
    assert plan[0].startswith("Run: grpo on tiny_qwen3") and len(plan) <= 30
    assert all(line.startswith("  ") for line in plan[1:]), plan
    assert summary[0] == summary[-1] == "=" * 78 and summary[1].startswith(f"Run completed: {STEPS} rollout steps")
    named = {line.split()[0] for line in summary if line.strip()}
    files = {"main.log", "config.yaml", "metrics.jsonl", "samples.jsonl", "result.json", "env.json", "logs/"}
    assert files | {"plots", "checkpoints", "wandb", "upload:"} <= named, summary
    training = next(line for line in summary if line.startswith("training"))
    assert "per trainer worker" in training and "GPU" not in training  # a CPU run in CPU terms
    # stderr: warnings and errors alone (none expected of this run), never the log or the workers
    assert all(line.startswith(("WARNING ", "ERROR ")) for line in proc.stderr.splitlines()), proc.stderr
    assert not [text for text in NOT_ON_A_PLAIN_TERMINAL if text in proc.stdout + proc.stderr]
    log = (run_dir / "main.log").read_text()
    assert "[slime.driver.driver][INFO] - phase startup started" in log
    assert log.count("[INFO] - phase train (rollout ") == 2 * STEPS  # each phase's start and end
    if "RAY_AUTH_MODE" not in os.environ:  # Ray's banner of a local cluster: in the log, not on the terminal
        assert "[WARNING] - Token authentication is enabled for this Ray cluster" in log
    assert_no_run_processes()


def test_verbose_redirected_puts_the_config_on_stdout_and_the_records_on_stderr(runs):
    run_dir, proc = runs["redirected_verbose"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"Resolved config (saved to {run_dir / 'config.yaml'}):\n")
    assert "\nDerived values:\n" in proc.stdout and "\nRun: grpo on tiny_qwen3" in proc.stdout
    assert re.search(r"^rollout +0/1  reward ", proc.stdout, flags=re.M) and "[INFO]" not in proc.stdout
    assert "[slime.driver.driver][INFO] - phase startup started" in proc.stderr
    # a worker's output, prefixed with its actor (its progress bars' carriage returns read as line ends here)
    assert re.search(r"^\(FSDPBackend\(rank=0\) pid=\d+\) ", proc.stderr, flags=re.M), proc.stderr
    assert "Loading weights" in proc.stderr and "Loading weights" in (run_dir / "logs" / "workers.log").read_text()
    assert_no_run_processes()
