"""train.async=true, the one-step-async loop (docs/architecture.md#one-step-asynchronous-loop): staleness bookkeeping,
its schedule, the checkpointed cursor of the in-flight rollout, the colocated refusal (a real run that overlaps:
tests/e2e/test_async_run.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import types

from slime.driver.loop import RunLoop, RunParts
from slime.driver.rollout_setup import rollout_setup
from slime.driver.run_state import RunState
from slime.plan.derive import derive
from slime.plan.run_plan import plan_run
from slime.plan.validate import collect_problems
from slime.rollout.base import RolloutHooks, RolloutOutput, RolloutProgress
from slime.rollout.data_source import DataSource
from slime.rollout.generate import append_engine_output
from slime.rollout.manager.engine_fleet import EngineFleet
from slime.rollout.producer import RolloutProducer
from slime.rollout.staleness import group_staleness, record_staleness, sample_staleness
from slime.types import Sample, SampleStatus
from tests.helpers.compose import LORA_ALONE, ROOT, typed_config
from tests.helpers.fake_run_world import FakeWorld, eager_ray


def test_sample_staleness_counts_the_oldest_engine_version():
    def stale(versions):
        return sample_staleness(Sample(weight_versions=versions), trainer_version=5)

    assert stale(["4"]) == 1
    assert stale(["3", "5"]) == 2  # a partial rollout resumed under newer weights
    assert stale([]) is None  # no engine call (SFT data, a custom rollout)
    assert stale(["None", "default"]) is None  # an engine that reports no version
    samples = [Sample(weight_versions=v) for v in (["2"], ["1", "2"], [], ["2"])]
    assert record_staleness(samples, trainer_version=2) == {
        "rollout/staleness_mean": 1 / 3,
        "rollout/staleness_max": 1.0,
        "rollout/staleness_hist/0": 2.0,
        "rollout/staleness_hist/1": 1.0,
    }
    assert [s.staleness for s in samples] == [0, 1, None, 0]
    assert record_staleness([Sample()], trainer_version=0) == {}


def test_staleness_counts_tokens_so_an_empty_aborted_call_adds_no_version():
    """A request aborted in the queue by a push returns no token: its call's version is no token's."""
    sample = Sample(tokens=[1, 2])
    append_engine_output(sample, _engine_out([7, 8], "3", "abort"))
    append_engine_output(sample, _engine_out([], "4", "abort"))  # aborted while waiting: nothing generated
    append_engine_output(sample, _engine_out([9], "5", "stop"))
    assert sample.token_versions == [3, 3, 5] and sample.weight_versions == ["3", "4", "5"]
    assert sample_staleness(sample, trainer_version=6) == 3
    assert group_staleness([sample, Sample(token_versions=[], response_length=0)], trainer_version=6) == 3
    spanning = {**_engine_out([1, 2, 3], "6", "stop")}
    spans = [{"version": "5", "start": 0, "end": 2}, {"version": "6", "start": 2, "end": 3}]
    spanning["meta_info"]["weight_versions"] = spans  # SGLang's (and vLLM's) spans: kept across an update
    other = Sample(tokens=[1])
    append_engine_output(other, spanning)
    assert other.token_versions == [5, 5, 6] and other.response_length == 3 and other.response == "text"


def test_masking_off_policy_tokens_covers_a_response_held_across_a_push():
    """mask_offpolicy_in_partial_rollout: the tokens an older version sampled in one held response get loss mask 0
    (tool tokens stay 0); under train.async=full the key needs no partial_rollout (the stream continues samples)."""
    from slime.rollout.generate import mask_older_tokens

    sample = Sample(tokens=[1])
    held = _engine_out([4, 5, 6, 7], "6", "stop")
    held["meta_info"]["weight_versions"] = [
        {"version": "5", "start": 0, "end": 3},
        {"version": "6", "start": 3, "end": 4},
    ]
    append_engine_output(sample, held)
    sample.loss_mask[1] = 0  # as a tool's token would be
    mask_older_tokens(sample)
    assert sample.token_versions == [5, 5, 5, 6] and sample.loss_mask == [0, 0, 0, 1]
    key = "rollout.mask_offpolicy_in_partial_rollout"
    assert [p.key for p in collect_problems(typed_config([f"{key}=true"]))] == [key]
    assert collect_problems(typed_config([f"{key}=true", "train.async=full"])) == []


def _engine_out(ids: list[int], version: str, finish: str) -> dict:
    logprobs = [[-0.5, t] for t in ids]
    meta = {"output_token_logprobs": logprobs, "weight_version": version, "finish_reason": {"type": finish}}
    return {"text": "text" if ids else "", "meta_info": meta}


# ---- the loops' schedules, with the Ray calls made eager (a `.remote()` runs at once) ------------------------


def _run(which, overrides: list[str], monkeypatch) -> FakeWorld:
    """`which` (RunLoop.run_sync or run_async) over five rollouts of the fake world."""
    eager_ray(monkeypatch)
    cfg = typed_config(["train.num_rollout=5", *overrides])
    world = FakeWorld()
    parts = RunParts(cfg=cfg, state=RunState(), manager=world, tracker=world, actor=world, pusher=world)
    which(RunLoop(parts, 0))
    return world


def test_async_loop_launches_the_next_rollout_before_training_and_syncs_after_it(monkeypatch):
    world = _run(RunLoop.run_async, ["train.async=true"], monkeypatch)
    expected = ["push 0", "generate 0"]
    for k in range(5):
        expected += ([f"generate {k + 1}"] if k < 4 else []) + [f"train {k}"] + (["save 4"] if k == 4 else [])
        expected.append(f"push {k + 1}")
    assert world.events == expected
    assert [m["rollout/staleness_max"] for m in world.logged] == [0, 1, 1, 1, 1]
    for m in world.logged[1:]:  # the wait for a rollout: none, its generation was waited for before the push
        assert m["perf/rollout_started_at"] <= m["perf/rollout_ended_at"] and "perf/rollout_overlap_time" in m


def test_async_loop_with_a_sync_interval_of_two(monkeypatch):
    world = _run(RunLoop.run_async, ["train.async=true", "rollout.weight_sync.interval=2"], monkeypatch)
    assert [e for e in world.events if e.startswith("push")] == ["push 0", "push 2", "push 4", "push 5"]
    assert [m["rollout/staleness_max"] for m in world.logged] == [0, 1, 2, 1, 2]


def test_async_loop_syncs_before_each_eval(monkeypatch):
    overrides = ["train.async=true", "rollout.weight_sync.interval=4", "eval=digit_task", "eval.interval=3"]
    world = _run(RunLoop.run_async, overrides, monkeypatch)
    assert [e for e in world.events if e.startswith("push")] == ["push 0", "push 3", "push 4", "push 5"]


def test_sync_loop_trains_on_fresh_weights(monkeypatch):
    world = _run(RunLoop.run_sync, [], monkeypatch)
    assert world.events[:5] == ["push 0", "generate 0", "train 0", "push 1", "generate 1"]
    assert [m["rollout/staleness_max"] for m in world.logged] == [0, 0, 0, 0, 0]


# ---- the rollout manager's producer: per-sample staleness, and the cursor a checkpoint keeps --------------------


def _producer(engine: dict[str, int]) -> RolloutProducer:
    """A rollout producer over no engines whose rollout function answers under `engine["version"]`."""
    cfg = typed_config(["rollout.batch_size=2", "rollout.n_samples_per_prompt=2", "train.global_batch_size=2"])
    setup = rollout_setup(cfg, plan_run(cfg, derive(cfg)))
    producer = RolloutProducer(setup, EngineFleet(dataclasses.replace(setup.fleet, specs=[]), []))
    producer.data_source = DataSource(None, n_samples_per_prompt=2, shuffle=False, seed=0)
    producer.hooks = RolloutHooks()
    producer._context = lambda progress, evaluation: types.SimpleNamespace(progress=progress)

    def rollout(ctx, rollout_id, data_source, evaluation):
        groups = data_source.get_groups(2)
        for s in (s for g in groups for s in g):
            s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs = [1, 2], 1, [1], [-0.5]
            s.reward, s.status, s.weight_versions = float(s.index % 2), SampleStatus.COMPLETED, [str(engine["version"])]
        return RolloutOutput(groups=groups)

    producer.rollout_fn = rollout
    return producer


def test_producer_records_staleness_and_a_checkpoint_keeps_the_in_flight_rollouts_prompts(tmp_path):
    engine = {"version": 0}
    producer = _producer(engine)
    _, metrics, preview = producer.rollout_step(0, RolloutProgress())
    assert metrics["rollout/staleness_max"] == 0 and [p["staleness"] for p in preview] == [0, 0, 0, 0]
    # launched while step 0 trains: the engines still hold version 0
    _, metrics, preview = producer.rollout_step(1, RolloutProgress())
    assert metrics["rollout/staleness_mean"] == 1 and {p["staleness"] for p in preview} == {1}
    assert metrics["perf/rollout_started_at"] <= metrics["perf/rollout_ended_at"] <= time.time()
    producer.save_checkpoint(0, str(tmp_path))  # step 0's checkpoint, taken after rollout 1 drew its prompts
    resumed = _producer(engine)
    resumed.load_checkpoint(0, str(tmp_path))
    _, _, preview = resumed.rollout_step(1, RolloutProgress())  # the resume draws rollout 1's prompts again
    assert [p["group_index"] for p in preview] == [2, 2, 3, 3]  # none lost
    producer.save_checkpoint(1, str(tmp_path))  # no rollout drawn ahead (the synchronous loop, or the last step)
    resumed.load_checkpoint(1, str(tmp_path))
    assert resumed.data_source.sample_group_index == 4


# ---- validation: async needs engines of its own ------------------------------------------------------------------


def test_async_refuses_colocation_and_a_sync_interval_without_async():
    problems = collect_problems(typed_config(["train.async=true", "cluster.colocate=true"]))
    assert [p.key for p in problems] == ["train.async"]
    assert "cluster.colocate=true" in problems[0].message and "train.async=off" in problems[0].fix
    for mode in ("off", "full"):
        problems = collect_problems(typed_config([f"train.async={mode}", "rollout.weight_sync.interval=2"]))
        assert [(p.key, p.value) for p in problems] == [("rollout.weight_sync.interval", 2)]
        assert "train.async=one_step" in problems[0].fix
    assert [p.key for p in collect_problems(typed_config(["train.async=true", "rollout.weight_sync.interval=0"]))] == [
        "rollout.weight_sync.interval"
    ]
    assert collect_problems(typed_config(["train.async=true", "rollout.weight_sync.interval=3"])) == []
    problems = collect_problems(typed_config(["train.async=true", "debug=rollout_only"]))
    assert [p.key for p in problems] == ["train.async"] and "debug.rollout_only runs only one" in problems[0].message


def test_train_async_is_a_mode_and_full_brings_its_staleness_keys():
    """off | one_step | full (false/true keep their meaning); full needs a bound >= 1, a known stale policy, the
    default rollout function and no dynamic filter; a bad mode names the three."""
    modes = {v: typed_config([f"train.async={v}"]).train.async_mode.value for v in ("false", "true", "off", "full")}
    assert modes == {"false": "off", "true": "one_step", "off": "off", "full": "full"}
    problems = collect_problems(typed_config(["train.async=sometimes"]))
    assert [p.key for p in problems] == ["train.async"] and "one_step" in problems[0].message
    bad = ["train.async=full", "train.max_staleness=0", "rollout.stale_policy=keep"]
    bad += [
        "rollout.function=slime.rollout.sft.generate_rollout",
        "algo.dynamic_filter=slime.rollout.filters.check_reward_nonzero_std",
    ]
    keys = sorted(p.key for p in collect_problems(typed_config(bad)))
    assert keys == ["algo.dynamic_filter", "rollout.function", "rollout.stale_policy", "train.max_staleness"]
    assert collect_problems(typed_config(["train.async=full", "rollout.stale_policy=regenerate"])) == []


def test_the_push_pause_mode_defaults_by_loop_and_in_place_is_refused_where_it_cannot_hold():
    """rollout.weight_sync.pause_mode null: in_place under full (requests run across every push), abort otherwise;
    a bad name, and in_place with colocated engines or an adapter synced alone, are refused naming the key."""
    from slime.config.async_mode import PauseMode

    def resolved(overrides):
        cfg = typed_config(overrides)
        return PauseMode.resolve(cfg.rollout.weight_sync.pause_mode, cfg.train.async_mode).value

    assert resolved(["train.async=full"]) == "in_place" and resolved(["train.async=one_step"]) == "abort"
    assert resolved(["train.async=full", "rollout.weight_sync.pause_mode=abort"]) == "abort"
    for bad, text in [
        (["rollout.weight_sync.pause_mode=retract"], "must be one of ['abort', 'in_place'] or null"),
        (["rollout.weight_sync.pause_mode=in_place", "cluster.colocate=true"], "with cluster.colocate=true"),
        (["train.async=full", *LORA_ALONE], "with model.lora synced alone"),
    ]:
        problems = [p for p in collect_problems(typed_config(bad)) if p.key == "rollout.weight_sync.pause_mode"]
        assert len(problems) == 1 and text in problems[0].message, bad
    assert collect_problems(typed_config(["train.async=full", "rollout.weight_sync.pause_mode=in_place"])) == []
    from slime.plan.dry_run import dry_run

    lines: list[str] = []
    assert dry_run(typed_config(["train.async=full", "train.max_staleness=2"]), out=lines.append) == 0
    assert (
        "fully async (engines keep up to 32 groups in flight, at most 3 step(s) of groups started ahead of the "
        "trainer, which takes them in start order; weight sync after every step, running requests held in place); "
        "groups over 2 version(s) stale: drop"
    ) in "\n".join(lines)


def test_cli_async_colocated_exits_2_before_starting_anything(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "main.py", "train.async=true", "cluster.colocate=true", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "train.async=True: the asynchronous loops generate while the trainer trains" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "result.json").exists() and not (run_dir / "checkpoints").exists()


def test_async_recipe_dry_run_plans_separate_train_and_engine_gpus():
    from slime.plan.dry_run import dry_run

    missing = ["model.hf_checkpoint=/absent/Qwen3-4B", "data.prompt_data=/absent/train.jsonl"]
    lines: list[str] = []
    assert dry_run(typed_config(["recipe=gpu/qwen3_4b_grpo_async", *missing]), out=lines.append) == 0
    text = "\n".join(lines)
    assert "Placement plan (8 GPU(s) of 1 node(s) x 8; disaggregated;" in text
    assert "node 0 GPU 3: actor rank 3 (dp 1, tp 1, pp 0, cp 0)\n  node 0 GPU 4: engine 0" in text
    assert "loop: one-step async (rollout k+1 generated while step k trains), weight sync every 1 rollout" in text
