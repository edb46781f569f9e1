"""The tracker's sinks with real wandb (offline) and TensorBoard: naming, config, steps, resume, tables."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slime.config.schema import LoggerConfig, WandbConfig
from slime.tracking.env_report import tracker_config
from slime.tracking.naming import HydraRun, run_identity, store_run_id, stored_run_id
from slime.tracking.step_axes import optimizer_step
from slime.tracking.tracker import Tracker
from tests.helpers.compose import typed_config
from tests.helpers.wandb_files import offline_runs

CHOICES = {"model": "tiny_qwen3", "algo": "grpo", "cluster": "local_cpu", "rollout": "hf", "recipe": None}


def test_identity_from_choices_overrides_and_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    cfg = typed_config([], output_dir=str(tmp_path / "run"))
    hydra = HydraRun(
        overrides=["algo.eps_clip=0.1", "seed=3", "paths.cache_dir=/c", "+rollout.router.extra_args.api_key=sk-1"],
        choices=CHOICES,
    )
    ident = run_identity(cfg, hydra, summary="grpo on tiny_qwen3")
    assert ident.group == "tiny_qwen3-grpo"
    assert ident.name == "tiny_qwen3-grpo:algo.eps_clip=0.1,+rollout.router.extra_args.api_key=<redacted>"
    assert ident.tags == ["model:tiny_qwen3", "algo:grpo", "cluster:local_cpu", "rollout:hf"]
    assert "sk-1" not in ident.notes and ident.notes.endswith("grpo on tiny_qwen3")
    assert ident.id.startswith("tiny_qwen3-grpo-") and ident.id == run_identity(cfg, hydra).id  # deterministic
    other = typed_config([], output_dir=str(tmp_path / "other"))
    assert run_identity(other, hydra).id != ident.id
    swept = HydraRun(
        overrides=["algo.eps_clip=0.2"], choices={**CHOICES, "recipe": "tiny_grpo"}, sweep_dir="/m/2026-11-26/17-03-00"
    )
    ident = run_identity(cfg, swept)
    assert (ident.group, ident.name) == ("2026-11-26_17-03-00", "tiny_grpo:algo.eps_clip=0.2")
    assert "recipe:tiny_grpo" in ident.tags
    # resuming: the id stored with the checkpoint, except in a sweep (its jobs would share one run)
    store_run_id(str(tmp_path / "ckpt"), dataclasses.replace(ident, id="stored-id"))
    resumed = typed_config([f"checkpoint.load={tmp_path / 'ckpt'}"], output_dir=str(tmp_path / "again"))
    assert run_identity(resumed, hydra).id == "stored-id"
    assert run_identity(resumed, swept).id.startswith("tiny_grpo-")


def test_config_is_redacted_and_carries_the_env_report(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789")
    cfg = typed_config(["+rollout.router.extra_args.api_key=sk-live-1", "logger.wandb.notes=uses tok-0123456789"])
    config = tracker_config(cfg, CHOICES, ["algo.eps_clip=0.1"])
    text = json.dumps(config)
    assert "sk-live-1" not in text and "tok-0123456789" not in text
    assert config["rollout"]["router"]["extra_args"]["api_key"] == "<redacted>"
    assert config["env"]["packages"]["wandb"] and config["env"]["seeds"]["seed"] == cfg.seed
    assert config["env"]["git"]["commit"] and config["hydra"]["choices"] == CHOICES


def test_optimizer_step_is_monotonic_in_log_order_and_continues_on_resume():
    k = 2  # the driver's order: eval 0, then per rollout r: train steps, the rollout record, eval r + 1
    order = [{"eval/step": 0}]
    for r in range(3):
        order += [{"rollout/step": r, "train/step": r * k + j} for j in range(k)]
        order += [{"rollout/step": r}, {"eval/step": r + 1}]
    steps = [optimizer_step(rec, k) for rec in order]
    assert steps == sorted(steps)
    # a run resumed at rollout 2 starts after everything rollout 1 logged
    first_resumed = optimizer_step({"rollout/step": 2, "train/step": 4}, k)
    assert first_resumed > max(
        s for s, rec in zip(steps, order) if rec.get("rollout/step", rec.get("eval/step", 0) - 1) <= 1
    )


def _run(tmp_path: Path, run_dir: Path, rollouts: range, load: str | None, k: int = 2) -> None:
    overrides = ["logger.tensorboard=true"] + ([f"checkpoint.load={load}"] if load else [])
    cfg = typed_config(overrides, output_dir=str(run_dir))
    identity = run_identity(cfg, HydraRun(overrides=overrides, choices=CHOICES))
    logger = LoggerConfig(
        wandb=WandbConfig(mode="offline"), progress=False, plot=False, tensorboard=True, log_samples_every=2
    )
    tracker = Tracker(
        logger,
        run_dir=run_dir,
        config=tracker_config(cfg, CHOICES, overrides),
        identity=identity,
        steps_per_rollout=k,
    )
    for r in rollouts:
        for j in range(k):
            tracker.log({"train/pg_loss": 0.1 * j, "train/kl_loss": 0.01}, rollout=r, train=r * k + j)
        tracker.log({"rollout/raw_reward": r / 10, "perf/step_time": 1.0}, rollout=r)
        tracker.log_samples(r, [{"prompt": "p", "response": "r", "reward": 1.0, "weight_versions": ["3"]}])
    tracker.on_save(str(run_dir / "checkpoints"), plot=False)
    outputs = tracker.finish(0)
    assert outputs["wandb_sync"] == f"wandb sync {outputs['wandb']}"


def test_resumed_run_continues_the_same_wandb_run_and_tensorboard_matches(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _run(tmp_path, first, range(0, 2), None)
    run_id = stored_run_id(str(first / "checkpoints"))
    _run(tmp_path, second, range(2, 3), str(first / "checkpoints"))
    (a,), (b,) = offline_runs(first), offline_runs(second)
    assert a["id"] == b["id"] == run_id == stored_run_id(str(second / "checkpoints"))
    steps = [row["_step"] for row in a["history"] + b["history"]]
    assert steps == sorted(set(steps)) == [0, 1, 2, 3, 4, 5]  # no wandb step twice over both runs
    assert [row["rollout/raw_reward"] for row in a["history"] + b["history"] if "rollout/raw_reward" in row] == [
        0.0,
        0.1,
        0.2,
    ]
    assert a["config"]["env"]["packages"]["wandb"] and a["config"]["seed"] == 1234
    tables = sorted(
        p.name.split("_")[0] for p in first.glob("wandb/offline-run-*/files/media/table/rollout/*.table.json")
    )
    assert tables == ["samples"]  # log_samples_every=2: rollout 0 only in the first run
    table = json.loads(next(first.glob("wandb/offline-run-*/files/media/table/rollout/*.table.json")).read_text())
    assert table["data"][0][3:5] == ["p", "r"] and table["data"][0][-1] == "3"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(first / "tensorboard"))
    events.Reload()
    logged = {k for line in (first / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert set(events.Tags()["scalars"]) == logged - {"train/step", "rollout/step"}
    assert [(e.step, e.value) for e in events.Scalars("rollout/raw_reward")] == [(0, 0.0), (1, pytest.approx(0.1))]
    assert [e.step for e in events.Scalars("train/pg_loss")] == [0, 1, 2, 3]
