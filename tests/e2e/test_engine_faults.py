"""An engine's server killed (SIGKILL, `debug.kill_engine_at`) during a rollout or a weight push, on the real
trainer and the built-in engine behind the real router: with fault tolerance the engine restarts, gets the trainer's
weights and the step goes on (a rollout generated again from where its data began, a push made again to every
engine), in every sync mode and both loops; without it the run stops (exit 3) naming the engine, and resume=auto
finishes it. The router killed (`debug.kill_router_at`) with fault tolerance: restarted, the rollout generated again.
Without fault tolerance, the router's and the engine's death found between steps: tests/e2e/test_killed_save_resume.py.
A push whose byte was flipped after the trainer's digests (`debug.corrupt_push_version`) stops the run naming it, or
with `rollout.weight_sync.on_mismatch=resync` restarts the engine and pushes again."""

from __future__ import annotations

import functools
import json

import pytest

from slime.assets.digit_task import write_dataset
from slime.rollout.dumps import epoch_coverage
from slime.tracking.jsonl import read_jsonl
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py, rewards, run_concurrently, two_epochs

FT = ["rollout.fault_tolerance.enabled=true"]
PUSH_MODES = {  # the modes the built-in engine takes on CPU
    "disk": ["rollout.weight_sync.mode=disk"],
    "distributed": ["rollout.weight_sync.mode=distributed"],
    "tensor": ["rollout.weight_sync.mode=tensor", "cluster.colocate=true"],
}
PUSH_FAILED = "the weight push of version 1 failed: engine 0 at http://"
PROBE_DIFF = "rollout/weight_probe_logprob_diff"


def drawn(run_dir, num_rollout: int) -> list[list[str]]:
    """Each rollout's prompts in the order its dump holds them (debug.save_rollout_data)."""
    return [[s["prompt"] for s in read_jsonl(run_dir / "rollout_data" / f"{i}.jsonl")] for i in range(num_rollout)]


def step_records(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "rollout/engine_restarts" in r]


def engine_0(run_dir) -> dict:
    return json.loads((run_dir / "engines.json").read_text())["engines"][0]


@pytest.mark.slow
def test_the_only_engine_killed_in_a_weight_push_is_restarted_and_the_push_made_again_in_every_sync_mode(tmp_path):
    """debug.kill_engine_at=weight_sync:0 kills the only engine's server once the push after step 0 began moving
    weights: the push fails naming the engine, the engine restarts and the push is made again. Rollout 1 then runs
    on the restarted server with the trainer's weights: its samples carry version 1 and the trainer's log-probs
    match the engine's (fp32: < 1e-5; the checkpoint's weights would give the step-0 model's)."""
    common = ["train.num_rollout=2", "debug.save_rollout_data=true", *FT, "debug.kill_engine_at=weight_sync:0"]
    runs = run_concurrently(
        {mode: functools.partial(main_py, tmp_path / mode, *common, *extra) for mode, extra in PUSH_MODES.items()}
    )
    for mode, proc in runs.items():
        run_dir = tmp_path / mode
        assert proc.returncode == 0, f"{mode}: {proc.stderr[-3000:]}"
        assert PUSH_FAILED in proc.stderr and "has no server process" in proc.stderr, f"{mode}: {proc.stderr[-3000:]}"
        assert "pushing again to every engine once the engine restarted" in proc.stderr
        assert [r["rollout/engine_restarts"] for r in step_records(run_dir)] == [1.0, 0.0], mode
        # the log-prob probes, the restarted engine's included: scored in step 1, before it trained (beside generation,
        # or colocated at the trainer's onload)
        records = step_records(run_dir)
        probed = [r[PROBE_DIFF] for r in records if PROBE_DIFF in r]
        assert PROBE_DIFF in records[1] and max(probed) < 1e-5, (mode, probed)
        assert engine_0(run_dir)["restarts"] == 1
        rollout_1 = read_jsonl(run_dir / "rollout_data" / "1.jsonl")
        assert {v for s in rollout_1 for v in s["token_versions"]} == {1}, mode
        diffs = [
            r["train/train_rollout_logprob_abs_diff"]
            for r in read_jsonl(run_dir / "metrics.jsonl")
            if r.get("rollout/step") == 1 and "train/train_rollout_logprob_abs_diff" in r
        ]
        assert diffs and max(diffs) < 1e-5, (mode, diffs)
    assert_no_run_processes()


@pytest.mark.slow
def test_without_fault_tolerance_an_engine_killed_in_a_push_stops_the_run_naming_it_and_resume_finishes(tmp_path):
    """No fault tolerance: the push's failure is exit 3 whose error names the engine, its pid and log (not the
    connection error alone); the step's checkpoint was saved before the push, and resume=auto finishes the run with
    each rollout logged once."""
    run_dir = tmp_path / "run"
    common = ["train.num_rollout=3", "checkpoint.save_interval=1"]
    stopped = main_py(run_dir, *common, "debug.kill_engine_at=weight_sync:0")
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["phase"] == "weight_sync"
    assert result["error"].startswith(f"EngineDied: {PUSH_FAILED}"), result["error"]
    assert "has no server process; its log: " in result["error"] and "engine_0.log" in result["error"]
    assert_no_run_processes()
    resumed = main_py(run_dir, *common, "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["start_rollout"] == 1
    assert len(rewards(run_dir)) == 3
    assert_no_run_processes()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loop", "kill_at"),
    [("sync", "rollout:1"), ("one_step_async", "log_probs:0")],
)
def test_the_only_engine_or_the_router_killed_in_a_rollout_is_restarted_and_the_rollout_generated_again(
    loop, kill_at, tmp_path
):
    """With fault tolerance, the run's only engine server is killed while rollout 1 generates (synchronous: as it
    begins; one-step async: as step 0 trains beside it): the rollout fails naming the engine, the engine restarts
    with the trainer's weights, and rollout 1 is generated again from the same place in the data: the run completes
    drawing the same prompts, in the same order, as one never interrupted (the rollout dumps of both). The
    synchronous loop's router killed as rollout 1 begins: restarted on its port with the engine registered again,
    and the same prompts drawn."""
    common = ["train.num_rollout=3", "debug.save_rollout_data=true", *FT]
    if loop == "one_step_async":
        common.append("train.async=true")
    jobs = {
        "engine": functools.partial(main_py, tmp_path / "engine", *common, f"debug.kill_engine_at={kill_at}"),
        "reference": functools.partial(main_py, tmp_path / "reference", *common),
    }
    if loop == "sync":
        jobs["router"] = functools.partial(main_py, tmp_path / "router", *common, f"debug.kill_router_at={kill_at}")
    runs = run_concurrently(jobs)
    for name, proc in runs.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    stderr = runs["engine"].stderr
    assert "engine 0 at http://" in stderr and "generating rollout 1 again" in stderr, stderr[-3000:]
    restarts = [r["rollout/engine_restarts"] for r in step_records(tmp_path / "engine")]
    assert sum(restarts) == 1.0 and engine_0(tmp_path / "engine")["restarts"] == 1
    assert drawn(tmp_path / "engine", 3) == drawn(tmp_path / "reference", 3)  # nothing skipped, nothing drawn twice
    if loop == "sync":
        workers = (tmp_path / "router" / "logs" / "workers.log").read_text()  # the rollout manager's records
        assert "the router at http://" in workers and "restarting it (restart 1)" in workers, workers[-3000:]
        (router,) = json.loads((tmp_path / "router" / "engines.json").read_text())["routers"]
        assert router["restarts"] == 1 and engine_0(tmp_path / "router")["restarts"] == 0
        assert drawn(tmp_path / "router", 3) == drawn(tmp_path / "reference", 3)
    assert_no_run_processes()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_in_the_fully_async_loop_the_only_engine_killed_is_restarted_and_every_prompt_trains_once(tmp_path):
    """train.async=full with fault tolerance over 2 epochs of 8 prompts (4 steps of 4 groups): the only engine's
    server killed as step 1 begins, when the stream starts the groups it has room for (those of the next step) on
    the dead engine. The engine restarts with the trainer's weights in the push after the step. A group whose
    requests gave up before that stays in its place and runs again, as does one whose requests give up after it
    (those paths on their own, every time: tests/rollout/test_stream.py); on a machine where the restart comes
    within the requests' retries they finish on the restarted engine. Either way every prompt is trained exactly once per epoch."""
    data = write_dataset(tmp_path / "digits.jsonl", num_prompts=8, seed=0)
    run_dir = tmp_path / "run"
    common = ["train.async=full", "rollout.stale_policy=regenerate", *two_epochs(data, prompts=8), *FT]
    proc = main_py(run_dir, *common, "debug.save_rollout_data=true", "debug.kill_engine_at=rollout:1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers = (run_dir / "logs" / "workers.log").read_text()  # the rollout manager's records, all of them
    assert "engine 0 restarted" in workers and engine_0(run_dir)["restarts"] == 1, workers[-3000:]
    assert epoch_coverage(run_dir / "rollout_data") == {0: dict.fromkeys(range(8), 1), 1: dict.fromkeys(range(8), 1)}
    assert_no_run_processes()


@pytest.mark.slow
def test_a_push_found_wrong_stops_the_run_naming_it_or_with_resync_is_made_again_on_a_restarted_engine(tmp_path):
    """debug.corrupt_push_version=2 flips one byte of the push after step 1, after the trainer digested it (as a
    transfer could): the verification (on by default) stops the run (exit 3) naming the engine, the tensor and its
    bucket; with rollout.weight_sync.on_mismatch=resync the engine is restarted, the push made again, and the run
    completes with the engine holding the trainer's weights (log-probs equal)."""
    common = ["train.num_rollout=3", "debug.corrupt_push_version=2"]
    runs = run_concurrently(
        {
            "fail": functools.partial(main_py, tmp_path / "fail", *common),
            "resync": functools.partial(
                main_py, tmp_path / "resync", *common, "rollout.weight_sync.on_mismatch=resync"
            ),
        }
    )
    fail, resync = runs["fail"], runs["resync"]
    assert fail.returncode == 3, fail.stderr[-3000:]
    named = "holds other weights than the trainer pushed as version 2: model.embed_tokens.weight (bucket 0 of 1"
    assert named in fail.stderr, fail.stderr[-3000:]
    assert resync.returncode == 0, resync.stderr[-3000:]
    assert "engine 0 holds other weights than the trainer pushed as version 2: restarted to be synced again" in (
        resync.stderr
    )
    run_dir = tmp_path / "resync"
    assert [r["rollout/engine_restarts"] for r in step_records(run_dir)] == [0.0, 1.0, 0.0]
    assert engine_0(run_dir)["restarts"] == 1
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/train_rollout_logprob_abs_diff" in r]
    assert steps and max(r["train/train_rollout_logprob_abs_diff"] for r in steps) < 1e-5
    assert_no_run_processes()
