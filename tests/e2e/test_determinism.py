"""rollout.deterministic (the embedded default): same config and seed, same run, whatever the load.

Two runs (and a third with another seed) start at once, so each is the others' background load and their
requests interleave differently; the two must log the same metrics (timings aside) and end with
bit-identical weights, and the third must differ. The one case is the embedded default made harder: two
engines serve the requests, and over-sampling with dapo's zero-std filter picks the groups kept.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.compose import ROOT
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_argv, selected_runs

pytestmark = pytest.mark.slow


def _start(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """main.py in the background; its stderr goes to `<run dir>.stderr` (no pipe to fill while others run)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with run_dir.with_suffix(".stderr").open("w") as stderr:
        return subprocess.Popen(
            main_argv(run_dir, *overrides),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def _metrics(run_dir: Path) -> list[dict]:
    """Every logged record without its wall-clock timings."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "_timestamp"} for r in records]


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = run_dir / "checkpoints"
    step = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    return load_file(ckpt / f"iter_{step:07d}" / "model" / "model.safetensors")


def _responses(run_dir: Path) -> list[str]:
    return [json.loads(line)["response"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]


CASES = {
    # over-sampling with the zero-std filter: which groups are kept must not depend on completion order,
    # nor on which of two engines served a request
    "dapo_oversampling_2_engines": [
        "train.num_rollout=2",
        "algo=dapo",
        "rollout.batch_size=8",
        "rollout.over_sampling_batch_size=12",
        "train.global_batch_size=32",
        "cluster.rollout.num_gpus=2",
    ],
}


STAGGER_S = 4.0


def _case_of(test: pytest.Item) -> str | None:
    return test.callspec.params["case"] if test.originalname == "test_same_seed_same_run" else None


@pytest.fixture(scope="module")
def case_runs(request, tmp_path_factory) -> dict[str, list[tuple[Path, int, str]]]:
    """{case: [(run dir, exit code, stderr)] for runs a, b (same seed) and other_seed}: the runs of every
    selected case start at once, each the others' background load. Returns once every run has ended."""
    root = tmp_path_factory.mktemp("determinism")
    started: dict[str, list[tuple[Path, subprocess.Popen]]] = {}
    for case in sorted(selected_runs(request, _case_of)):
        started[case] = []
        for name, seed in [("a", []), ("b", []), ("other_seed", ["seed=1"])]:
            if len(started) + len(started[case]) > 1:  # Ray gives a new node's raylet 30 s to register:
                time.sleep(STAGGER_S)  # the clusters start a little apart
            started[case].append((root / case / name, _start(root / case / name, [*CASES[case], *seed])))
    return {
        case: [(run_dir, proc.wait(timeout=600), run_dir.with_suffix(".stderr").read_text()) for run_dir, proc in runs]
        for case, runs in started.items()
    }


@pytest.mark.parametrize("case", list(CASES))
def test_same_seed_same_run(case, case_runs):
    overrides = CASES[case]
    for _, code, stderr in case_runs[case]:
        assert code == 0, stderr[-3000:]
    runs = [run_dir for run_dir, _, _ in case_runs[case]]
    first, second = (_metrics(run_dir) for run_dir in runs[:2])
    rewards = [r["rollout/raw_reward"] for r in first if "rollout/raw_reward" in r]
    assert len(rewards) == int(overrides[0].split("=")[1])
    assert rewards == [r["rollout/raw_reward"] for r in second if "rollout/raw_reward" in r]
    assert first == second
    weights = [_final_weights(run_dir) for run_dir in runs]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    # not vacuous: the seed reaches the sampling, so another seed gives another run
    assert _responses(runs[0]) == _responses(runs[1]) != _responses(runs[2])
    assert not all(torch.equal(weights[0][name], weights[2][name]) for name in weights[0])
    if "algo=dapo" in overrides:
        assert any(k.startswith("rollout/dynamic_filter/drop") for r in first for k in r)
    assert_no_run_processes()
