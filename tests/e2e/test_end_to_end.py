"""The real thing on CPU: main.py with Ray, the router, engines and trainers, as a user runs it."""

from __future__ import annotations

import functools
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from tests.helpers.compose import LORA_ALONE, LORA_MERGED, ROOT, typed_config
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import checkpoint_gib, main_argv, main_py, rewards, run_concurrently, selected_runs
from tests.helpers.wandb_files import offline_runs

# The module's pool (seven jobs, three at a time, one of them two runs in a row) took 520 s on 2 idle cores, and over
# 600 s beside the unit tests before the LoRA run joined it; on a machine loaded further (more runs alive at once)
# the embedded run alone took 1105 s. Its first test, which waits for the pool, gets the two 60-rollout runs'
# 1800 s and a later wave of the shorter runs.
LONG_RUN_TIMEOUT_S = 1800
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]


def _embedded_default(run_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The whole 60-rollout run: it starts with the session, beside two of the pool's other runs and the unit
    tests' heaviest fixtures, and outlasted 600 s in CI (2 cores)."""
    started = time.monotonic()
    proc = main_py(run_dir, tracked=True, timeout=LONG_RUN_TIMEOUT_S)
    return proc, time.monotonic() - started


def _data_parallel(run_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    """A dp2 run saving a checkpoint and its rollouts; then, at once, its resume and a replay of its rollouts."""
    first_dir = run_dir / "first"
    first = main_py(
        first_dir,
        "recipe=embedded_dp2",
        "train.num_rollout=3",
        "checkpoint.save_interval=2",
        "debug.save_rollout_data=true",
        tracked=True,
    )
    if first.returncode != 0:
        return {"first": first}
    resumed = ["recipe=embedded_dp2", "train.num_rollout=5", f"checkpoint.load={first_dir / 'checkpoints'}"]
    replay = ["recipe=embedded_dp2", "train.num_rollout=2", f"debug.load_rollout_data={first_dir / 'rollout_data'}"]
    later = run_concurrently(
        {
            "second": functools.partial(main_py, run_dir / "second", *resumed, tracked=True),
            "replay": functools.partial(main_py, run_dir / "replay", *replay),
        }
    )
    return {"first": first, **later}


def _sigterm_after_two_rollouts(run_dir: Path) -> tuple[bool, int]:
    """The embedded default, sent SIGTERM once 2 rollouts are logged: (still running then, exit code)."""
    proc = subprocess.Popen(
        main_argv(run_dir),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while (
        not (metrics.exists() and metrics.read_text().count("rollout/raw_reward") >= 2) and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    running = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    try:
        return running, proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return running, proc.wait()


def _multirun(sweep_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "main.py",
            "--multirun",
            "recipe=glob(embedded_*)",
            "train.num_rollout=1",
            "logger.progress=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


# The runs of this module's tests, the longest first: they run three at a time (run_concurrently); the three
# 60-rollout runs start in the first wave, so that none waits for a slot.
JOBS: dict[str, Callable[[Path], Any]] = {
    "embedded_default": _embedded_default,
    # the adapter and the trained gain synced alone, in the embedded run's disk mode (tensor mode's:
    # tests/engine/hf/test_lora_serving.py, tests/sync/test_sync_into_sglang.py)
    "lora_adapter_sync": lambda run_dir: main_py(run_dir, *LORA_ALONE, timeout=LONG_RUN_TIMEOUT_S),
    "lora": lambda run_dir: main_py(run_dir, *LORA_MERGED, timeout=LONG_RUN_TIMEOUT_S),
    "data_parallel": _data_parallel,
    "multirun": _multirun,
    "sigterm": _sigterm_after_two_rollouts,
    "startup_failure": lambda run_dir: main_py(
        run_dir, "data.source_class=tests.helpers.user_hooks.DataSourceFailingAtStartup", "train.num_rollout=2"
    ),
    "eval_reward_failure": lambda run_dir: main_py(
        run_dir,
        "recipe=embedded_eval",
        "rollout.rm_type=null",
        "rollout.custom_rm_path=tests.helpers.user_hooks.reward_whose_judge_is_missing",
        "train.num_rollout=1",
    ),
}
RUN_OF_TEST = {
    "test_embedded_default_learns": "embedded_default",
    "test_multirun_sweeps_recipes_by_glob": "multirun",
    "test_data_parallel_run_and_resume": "data_parallel",
    "test_interrupt_stops_everything": "sigterm",
    "test_failure_during_startup_writes_result_and_cleans_up": "startup_failure",
    "test_an_eval_whose_rewards_fail_stops_and_reports_no_score": "eval_reward_failure",
    "test_lora_synced_merged_learns_the_digit_task": "lora",
    "test_lora_adapter_sync_with_the_trained_gain_learns_the_digit_task": "lora_adapter_sync",
}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, tuple[Path, Any]]:
    """{key: (run dir, what its job returned)} for the selected tests; returns once every run has ended."""
    root = tmp_path_factory.mktemp("e2e")
    wanted = selected_runs(request, lambda test: RUN_OF_TEST.get(test.originalname))
    results = run_concurrently({key: functools.partial(job, root / key) for key, job in JOBS.items() if key in wanted})
    return {key: (root / key, result) for key, result in results.items()}


def test_embedded_default_learns(runs):
    """`python main.py` as shipped: learns the digit task, leaves every artifact, no process behind."""
    run_dir, (proc, elapsed) = runs["embedded_default"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    record("embedded_default", run_dir, proc)
    curve = rewards(run_dir)
    assert len(curve) == 60
    last3, first = sum(curve[-3:]) / 3, curve[0]
    # Over seeds 1-5 and 1234 (deterministic runs): first 0.012-0.020, last-3 mean 0.954-0.974.
    assert first <= 0.1 and last3 >= 0.8, curve
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*records)
    assert {"rollout/step", "rollout/raw_reward", "train/pg_loss", "train/grad_norm", "train/step"} <= keys
    # the engine's weights as it reports them after each rollout: the checkpoint's bytes (and a 64-byte rotary table)
    engine_gib = [r["perf/engine_gib/weight"] for r in records if "rollout/raw_reward" in r]
    assert len(engine_gib) == 60 and all(g == pytest.approx(checkpoint_gib(run_dir), rel=1e-3) for g in engine_gib)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["rollouts_completed"] == 60
    assert (run_dir / "config.yaml").exists() and (run_dir / "reward_curve.png").stat().st_size > 10_000
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    # the report on stdout: the plan summary, a line per rollout step, the end summary (the resolved config is in
    # config.yaml: logger.console=verbose prints it)
    assert proc.stdout.startswith("Run: grpo on tiny_qwen3 (preset embedded), seed 1234\n")
    assert len(re.findall(r"^rollout +\d+/60  reward ", proc.stdout, flags=re.M)) == 60
    assert "Derived values" not in proc.stdout and "[INFO]" not in proc.stdout + proc.stderr
    assert_no_run_processes()
    print(f"embedded default: {elapsed:.1f}s wall, first {first:.3f}, last3 {last3:.3f}")


def test_data_parallel_run_and_resume(runs):
    """Two training ranks over gloo; then a rerun with checkpoint.load continues at the next rollout; and the
    first run's rollout dumps train again without engines (debug.load_rollout_data), step for step the same."""
    run_dir, procs = runs["data_parallel"]
    first_dir, second_dir, replay_dir = run_dir / "first", run_dir / "second", run_dir / "replay"
    assert procs["first"].returncode == 0, procs["first"].stderr[-3000:]
    ckpt = first_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (ckpt / "iter_0000001" / "model" / "model.safetensors").exists()
    assert (ckpt / "rollout" / "global_dataset_state_dict_2.pt").exists()
    assert procs["second"].returncode == 0, procs["second"].stderr[-3000:]
    steps = [
        json.loads(line)["rollout/step"]
        for line in (second_dir / "metrics.jsonl").read_text().splitlines()
        if "rollout/raw_reward" in line
    ]
    assert steps == [3, 4]
    result = json.loads((second_dir / "result.json").read_text())
    assert (result["start_rollout"], result["rollouts_completed"]) == (3, 2)
    # The resumed run appends to the same (offline) wandb run: same id, wandb steps continue, none twice.
    (first_run,), (second_run,) = offline_runs(first_dir), offline_runs(second_dir)
    assert first_run["id"] == second_run["id"] == json.loads((ckpt / "tracking_run.json").read_text())["id"]
    wandb_steps = [row["_step"] for row in first_run["history"] + second_run["history"]]
    assert wandb_steps == sorted(set(wandb_steps))
    assert [r["rollout/step"] for r in second_run["history"] if "rollout/raw_reward" in r] == [3, 4]
    assert second_run["config"]["checkpoint"]["load"] == str(ckpt) and "env" in second_run["config"]
    check_rollout_dumps(first_dir / "rollout_data", num_rollout=3)
    assert procs["replay"].returncode == 0, procs["replay"].stderr[-3000:]
    assert not [p.name for p in (replay_dir / "logs").glob("*.log") if p.name != "workers.log"]  # no router, no engine
    train = lambda d: [  # noqa: E731
        (r["train/step"], r["train/pg_loss"], r["train/grad_norm"])
        for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        if "train/pg_loss" in r
    ]
    steps_per_rollout = len(train(first_dir)) // 3
    assert steps_per_rollout >= 1 and train(replay_dir) == train(first_dir)[: 2 * steps_per_rollout]
    assert rewards(replay_dir) == rewards(first_dir)[:2]
    assert_no_run_processes()


def check_rollout_dumps(dump_dir: Path, *, num_rollout: int) -> None:
    """One file per rollout; whole groups of n samples with what training and the epoch check need."""
    cfg = yaml.safe_load((dump_dir.parent / "config.yaml").read_text())
    n, batch = cfg["rollout"]["n_samples_per_prompt"], cfg["rollout"]["batch_size"]
    assert sorted(p.name for p in dump_dir.iterdir()) == [f"{i}.jsonl" for i in range(num_rollout)]
    seen = set()
    for i in range(num_rollout):
        samples = [json.loads(line) for line in (dump_dir / f"{i}.jsonl").read_text().splitlines()]
        assert len(samples) == n * batch
        for s in samples:
            assert {"index", "group_index", "prompt_index", "epoch", "prompt", "label", "metadata", "status"} <= set(s)
            assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == s["response_length"] and s["reward"] in (0, 1)
        groups = {s["group_index"]: s["prompt_index"] for s in samples}
        assert [s["group_index"] for s in samples] == sorted(s["group_index"] for s in samples)
        assert all(sum(s["group_index"] == g for s in samples) == n for g in groups)
        assert seen.isdisjoint(groups.values()) and all(s["epoch"] == 0 for s in samples)  # no prompt twice
        seen |= set(groups.values())


def test_failure_during_startup_writes_result_and_cleans_up(runs):
    """User code that passes every check fails once the rollout manager runs it at startup (a data source whose
    constructor raises): exit 3, result.json names the phase, no process is left."""
    run_dir, proc = runs["startup_failure"]
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["phase"] == "startup"
    assert "this data source fails at startup on purpose" in result["error"]
    assert_no_run_processes()


def test_an_eval_whose_rewards_fail_stops_and_reports_no_score(runs):
    """The eval before training, whose every reward fails (a judge missing at call time): the run stops under the
    training rollouts' rule (rollout.reward.max_failure_ratio), naming the dataset; no eval score is logged."""
    run_dir, proc = runs["eval_reward_failure"]
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["phase"] == "eval"
    assert "eval dataset 'digit_task': 64 of 64 samples (100.0%) failed their reward" in result["error"]
    assert "judge_of_this_test" in result["error"]
    logged = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
    assert "eval/digit_task" not in logged
    assert_no_run_processes()


def test_interrupt_stops_everything(runs):
    """SIGTERM from outside, as `kill` or a job scheduler sends it (SIGINT in each phase: test_interrupts.py).
    Ray's start replaces the SIGTERM handler; the run must still hear it."""
    run_dir, (running, code) = runs["sigterm"]
    assert running, "the run ended before it could be interrupted"
    assert code == 143
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["error"] == "SIGTERM"
    # SIGTERM came once 2 steps were logged; a step counts as completed after its logging (and eval), so the
    # signal may land between the two
    logged = len(rewards(run_dir))
    assert logged >= 2 and logged - 1 <= result["rollouts_completed"] <= logged, (logged, result)
    assert_no_run_processes()


def test_multirun_sweeps_recipes_by_glob(runs):
    """`--multirun 'recipe=glob(...)'` finds recipes/ through conf/recipe; jobs run one after another in one
    process, each with its own Ray session (the second would reuse the first's without a shutdown).

    The jobs start from the same weights and seed with one training rank (embedded_eval), two data-parallel
    ranks (embedded_dp2) and two tensor-parallel ranks of one shard (embedded_tp2): the same rollout, and
    the same step to float32 rounding, through the real runtime's dispatch and weight sync."""
    sweep_dir, proc = runs["multirun"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {
        json.loads((d / "result.json").read_text())["run_dir"]: d for d in sorted(sweep_dir.iterdir()) if d.is_dir()
    }
    assert len(results) == 3
    first_steps = {}
    for d in results.values():
        records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        first_steps[d.name] = (
            [r for r in records if "rollout/raw_reward" in r][0],
            [r for r in records if "train/step" in r],
        )
    (rollout, steps), *others = first_steps.values()
    for other_rollout, other_steps in others:
        assert other_rollout["rollout/raw_reward"] == rollout["rollout/raw_reward"]
        for mine, theirs in zip(steps, other_steps):
            for key in ("train/pg_loss", "train/grad_norm", "train/entropy_loss"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    eval_records = [
        json.loads(line)
        for d in results.values()
        for line in (d / "metrics.jsonl").read_text().splitlines()
        if "eval/step" in line
    ]
    assert eval_records and {
        "eval/digit_task",
        "eval/digit_task/pass@1",
        "eval/digit_task_sampled",
        "eval/digit_task_sampled/response_len/mean",
        "eval/digit_task_sampled/pass@4",
    } <= set(eval_records[0])
    assert (sweep_dir / "sweep_rewards.png").stat().st_size > 10_000  # the sweep's comparison (hydra callback)
    # the sweep's table: the override that differs (shared ones left out), the best run marked, also on stdout
    table = [line for line in (sweep_dir / "sweep_summary.md").read_text().splitlines() if line.startswith("| ")]
    assert "| recipe |" in table[0] and "num_rollout" not in table[0]
    assert sorted(line.split("|")[3].strip() for line in table[2:]) == ["embedded_dp2", "embedded_eval", "embedded_tp2"]
    assert sum(line.startswith("| best |") for line in table) == 1
    assert "sweep_summary.md" in proc.stdout and "embedded_tp2" in proc.stdout
    groups = {run["group"] for d in results.values() for run in offline_runs(d)}
    assert groups == {f"{sweep_dir.parent.name}_{sweep_dir.name}"}  # one wandb group: the sweep
    assert_no_run_processes()


def test_lora_synced_merged_learns_the_digit_task(runs):
    """`python main.py model.lora.rank=8 model.lora.sync_merged=true`: adapters on a frozen base learn the digit task;
    the engine generates with the trainer's merged weights after every sync; the checkpoint holds what trains."""
    run_dir, proc = runs["lora"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    record("lora_merged", run_dir, proc)
    curve = rewards(run_dir)
    assert len(curve) == 60 and curve[0] <= 0.1 and sum(curve[-3:]) / 3 >= 0.8, curve
    model = typed_config(list(LORA_MERGED)).model
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/trainable_params" in r]
    # 2 layers x 8 x (128 + 96 + 96 + 128 + 256 + 256 + 256) adapters + the final norm's 64 gains
    assert {r["train/trainable_params"] for r in steps} == {model.lora.parameter_count(model)} == {19_520}
    # the engine generates with exactly the weights the trainer scores with: adapters merged into the base
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in steps]
    assert len(diffs) == 120 and max(diffs) < 1e-5
    saved = load_file(run_dir / "checkpoints" / "iter_0000059" / "model" / "adapter_model.safetensors")
    assert len(saved) == 2 * 7 * 2 + 1 and "model.norm.weight" in saved


def test_lora_adapter_sync_with_the_trained_gain_learns_the_digit_task(runs):
    """`python main.py model.lora.rank=8` (the embedded preset: the final norm's gain trained beside the adapters,
    both synced alone): the adapters learn the digit task; each sync moves the adapter (fp32 A and B) and the gain,
    4 bytes per trainable parameter; the engine, serving the adapter over its base with the gain written into it,
    scores every sampled token as the trainer does."""
    run_dir, proc = runs["lora_adapter_sync"]
    record("lora_adapter_sync", run_dir, proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    curve = rewards(run_dir)
    assert len(curve) == 60 and curve[0] <= 0.1 and sum(curve[-3:]) / 3 >= 0.8, curve
    model = typed_config(list(LORA_ALONE)).model
    assert model.lora.parameter_count(model) == 19_456 + 64  # the adapters, and the final norm's gain
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    pushed = [r["perf/update_weights_bytes"] for r in records if "perf/update_weights_bytes" in r]
    assert pushed == [(19_456 + 64) * 4] * 60
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records if "train/trainable_params" in r]
    assert len(diffs) == 120 and max(diffs) < 1e-5
    engine_log = (run_dir / "logs" / "engine_0.log").read_text()
    assert engine_log.count(": load_lora_adapter 'policy'") == 61  # before rollout 0, then after each step
    assert engine_log.count(": unload_lora_adapter 'policy'") == 60
    assert engine_log.count("Succeeded to update model weights (1 tensors from ") == 61  # the gain, each time
