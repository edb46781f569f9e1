"""Hostile config: every case is a clear problem naming the key, found before anything starts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException

from slime.plan.validate import validate
from tests.helpers.compose import ROOT, compose_config, typed_config
from tests.helpers.validation import problems_for, snapshot

# (overrides, the key named, text of the message); {tmp} is the test's tmp_path
CASES = {
    "range: negative lr": (["train.lr=-1"], "train.lr", "must be > 0"),
    "range: zero samples per prompt": (["rollout.n_samples_per_prompt=0"], "rollout.n_samples_per_prompt", "> 0"),
    "range: top_p above 1": (["rollout.top_p=1.5"], "rollout.top_p", "(0, 1]"),
    "range: watchdog of 0 s": (["runtime.phase_timeout_s=0"], "runtime.phase_timeout_s", "must be > 0 seconds"),
    "range: negative watchdog": (["runtime.phase_timeout_s=-5"], "runtime.phase_timeout_s", "must be > 0 seconds"),
    "range: startup watchdog of 0 s": (["runtime.startup_timeout_s=0"], "runtime.startup_timeout_s", "must be > 0"),
    "several nodes: loopback host": (["cluster.num_nodes=2"], "cluster.host", "one node's address with cluster.num"),
    "range: save every 0 rollouts": (["checkpoint.save_interval=0"], "checkpoint.save_interval", "must be > 0"),
    "range: eval every 0 rollouts": (["eval.interval=0"], "eval.interval", "must be > 0"),
    "range: negative ckpt_step": (["checkpoint.ckpt_step=-1"], "checkpoint.ckpt_step", "must be >= 0"),
    "range: negative log_samples": (["logger.log_samples=-1"], "logger.log_samples", "must be >= 0"),
    "range: a stop token outside the vocabulary": (
        ["rollout.stop_token_ids=[2,500,-1]"],
        "rollout.stop_token_ids",
        "[500, -1] outside the vocabulary (model.vocab_size=80)",
    ),
    "range: failure ratio above 1": (
        ["rollout.reward.max_failure_ratio=1.5"],
        "rollout.reward.max_failure_ratio",
        "[0, 1]",
    ),
    "context: prompt + response beyond the model": (
        ["rollout.max_prompt_len=400", "rollout.max_response_len=200"],
        "rollout.max_response_len",
        "exceed the model's context (model.max_position_embeddings=512)",
    ),
    "path: checkpoint.save under a file": (
        ["checkpoint.save={tmp}/a_file/ckpt"],
        "checkpoint.save",
        "a_file is a file, not a directory",
    ),
    "path: critic save under a file": (
        ["train.critic.save={tmp}/a_file"],
        "train.critic.save",
        "a file, not a directory",
    ),
    "batch: steps per rollout do not divide": (
        ["train.num_steps_per_rollout=3"],
        "train.global_batch_size",
        "128 × 3 = 384",
    ),
    "batch: zero prompts per rollout": (["rollout.batch_size=0"], "rollout.batch_size", "must be > 0"),
    "gpu: zero GPUs per engine": (
        ["cluster.rollout.num_gpus_per_engine=0"],
        "cluster.rollout.num_gpus_per_engine",
        "must be >= 1",
    ),
    "gpu: a node of zero GPUs": (["cluster.num_gpus_per_node=0"], "cluster.num_gpus_per_node", "must be >= 1"),
    "conflict: resume=auto and load": (
        ["checkpoint.resume=auto", "checkpoint.load={tmp}"],
        "checkpoint.resume",
        "conflicts with checkpoint.load",
    ),
    "conflict: num_epoch and num_rollout": (["train.num_epoch=2"], "train.num_epoch", "one of them sizes the run"),
    "conflict: group_rm without a function": (["rollout.group_rm=true"], "rollout.group_rm", "custom_rm_path"),
    "conflict: remote_rm without a URL": (["rollout.rm_type=remote_rm"], "rollout.rm_url", "needs the reward model"),
    "choice: resume=always": (["checkpoint.resume=always"], "checkpoint.resume", "must be one of ['auto']"),
    "choice: hang the trainer before it exists": (["debug.hang_at=startup"], "debug.hang_at", "weight_sync to save"),
    "choice: kill the router before it exists": (
        ["debug.kill_router_at=prepare"],
        "debug.kill_router_at",
        "kills the run's router, which exists from weight_sync to save",
    ),
    "choice: kill an engine at no phase": (
        ["debug.kill_engine_at=never:1"],
        "debug.kill_engine_at",
        "PHASE:ROLLOUT_ID",
    ),
    "choice: on_mismatch=ignore": (
        ["rollout.weight_sync.on_mismatch=ignore"],
        "rollout.weight_sync.on_mismatch",
        "unknown; one of fail, resync",
    ),
    "conflict: resync without verification": (
        ["rollout.weight_sync.on_mismatch=resync", "rollout.weight_sync.verify=false"],
        "rollout.weight_sync.on_mismatch",
        "resync acts on a failed verification",
    ),
    "conflict: a corrupted push nobody verifies": (
        ["debug.corrupt_push_version=2", "rollout.weight_sync.verify=false"],
        "debug.corrupt_push_version",
        "it tests the verification of pushes",
    ),
    "conflict: delta into a disk sync": (
        ["rollout.weight_sync.delta=true"],
        "rollout.weight_sync.mode",
        "a delta push is sent in tensor or distributed mode",
    ),
    "conflict: delta into vLLM": (
        ["rollout=vllm", "rollout.weight_sync.mode=distributed", "rollout.weight_sync.delta=true"],
        "rollout.engine",
        "only the built-in engine applies deltas",
    ),
    "conflict: delta unverified": (
        ["rollout.weight_sync.mode=distributed", "rollout.weight_sync.delta=true", "rollout.weight_sync.verify=false"],
        "rollout.weight_sync.verify",
        "which verification learns",
    ),
    "choice: full_every=0": (["rollout.weight_sync.full_every=0"], "rollout.weight_sync.full_every", "must be >= 1"),
    "range: probe_tokens=-1": (
        ["rollout.weight_sync.probe_tokens=-1"],
        "rollout.weight_sync.probe_tokens",
        "must be >= 0",
    ),
    "range: probe_tolerance=0": (
        ["rollout.weight_sync.probe_tolerance=0"],
        "rollout.weight_sync.probe_tolerance",
        "must be > 0 (a mean |log-prob difference|)",
    ),
    "unknown key: +train.lr_scheduler": (["+train.lr_scheduler=cosine"], "train.lr_scheduler", "no such option"),
    "unknown key: +rollout.temperture (typo)": (
        ["+rollout.temperture=0.5"],
        "rollout.temperture",
        "did you mean temperature",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_problem_names_the_key(case, tmp_path):
    overrides, key, text = CASES[case]
    (tmp_path / "a_file").write_text("not a directory")
    found = problems_for([o.format(tmp=tmp_path) for o in overrides], tmp_path / "run")
    assert key in found, found
    assert text in found[key], found[key]


@pytest.mark.parametrize(
    "override,key",
    [("rollout.batch_size=abc", "rollout.batch_size"), ("seed=1.5", "seed"), ("cluster.colocate=maybe", "colocate")],
)
def test_wrong_types_are_refused_when_composing(override, key):
    with pytest.raises(ConfigCompositionException) as info:
        compose_config([override])
    assert key in f"{info.value} {info.value.__cause__}"


@pytest.mark.parametrize(
    "overrides,key,fix",
    [
        (["logger.wandb.mode=offline"], "logger.wandb.mode", "pip install wandb, or set logger.wandb.mode=disabled"),
        (["logger.wandb.mode=auto"], "logger.wandb.mode", "logs to wandb (offline)"),  # auto without an API key
        (
            ["logger.wandb.mode=disabled", "logger.tensorboard=true"],
            "logger.tensorboard",
            "set logger.tensorboard=false",
        ),
    ],
)
def test_a_logger_package_missing_is_found_before_the_run(overrides, key, fix, tmp_path, monkeypatch):
    """A machine without wandb (a minimal GPU image may lack it): an error at start-up, not an ImportError after the
    cluster and engines have started; with the sink disabled, the same machine runs."""
    find_spec = importlib.util.find_spec
    missing = {"wandb", "tensorboard"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else find_spec(name, *a))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a wandb key
    found = problems_for(overrides, tmp_path / "run")
    assert list(found) == [key] and fix in found[key], found
    validate(typed_config(["logger.wandb.mode=disabled"], str(tmp_path / "run")))


def run_main(run_dir, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "main.py", f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_exit_2_leaves_an_earlier_run_untouched(earlier_run):
    """Rerunning into a finished run's directory with a bad config: exit 2, every problem named, every file intact."""
    before = snapshot(earlier_run)
    proc = run_main(earlier_run, "checkpoint.save_interval=0", "+train.lr_schedulr=cosine", "runtime.phase_timeout_s=0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    # the mistyped key first (main.py's front door), then what validation of the rest finds
    assert proc.stderr.startswith("Configuration error: +train.lr_schedulr=cosine: no such key")
    assert "invalid configuration (2 problems)" in proc.stderr
    for key in ("checkpoint.save_interval=0", "runtime.phase_timeout_s=0"):
        assert key in proc.stderr
    assert "Traceback" not in proc.stderr
    # refused before Hydra's job: not even Hydra's records of it are written
    assert snapshot(earlier_run) == before


def test_cli_directory_as_prompt_file_exits_2_without_a_traceback(tmp_path):
    """It used to escape validation as IsADirectoryError (a traceback, exit 1 mapped to 2)."""
    data = tmp_path / "prompts.jsonl"
    data.mkdir()
    proc = run_main(tmp_path / "run", f"data.prompt_data={data}", "data.generator=null")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{data}: a directory, not a prompt file" in proc.stderr
    assert not (tmp_path / "run" / "config.yaml").exists()
