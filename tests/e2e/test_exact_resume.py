"""Exact resume: runs SIGKILLed mid-rollout, mid-train and mid-save, each resumed with
checkpoint.resume=auto, end bit-identical to a run never interrupted, with the same metrics.

The three killed runs start beside one uninterrupted reference run (their start-up waits overlap; their
Ray nodes one after another), and each is resumed as soon as it died. Each kill is `debug.signal_at=...` with `debug.signal=SIGKILL`: the
driver kills every process of the run at once, as a crash does. Mid-train and mid-save also set
`debug.hang_at` at that point (the trainer never finishes its step; the save hangs with its data-source
state written and the trainer's not), so the kill lands there whatever the machine's speed.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slime.config.resume import tracked_iteration
from slime.driver.weight_push import PROBE_DIFFS
from slime.tracking.jsonl import read_jsonl
from tests.helpers.compose import ROOT
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_argv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # ten runs, four at a time, on a loaded machine

NUM_ROLLOUT, K = 2, 2  # rollouts; optimizer steps per rollout
COMMON = [
    f"train.num_rollout={NUM_ROLLOUT}",
    f"train.num_steps_per_rollout={K}",
    "checkpoint.save_interval=1",
    "checkpoint.resume=auto",
]
# (where the kill lands, its overrides, the phase main.log shows under way); each leaves checkpoint 0. A rollout
# phase of the embedded run lasts 0.22-0.5 s on a 2-core box (the engine batches its 256 requests): the mid-rollout
# kill comes 0.1 s in.
KILLS = [
    ("mid_rollout", ["debug.signal_at=rollout:1", "debug.signal_delay_s=0.1"], "rollout (rollout 1)"),
    (
        "mid_train",
        ["debug.hang_at=train:1", "debug.signal_at=train:1", "debug.signal_delay_s=0.2"],
        "train (rollout 1)",
    ),
    ("mid_save", ["debug.hang_at=save:1", "debug.signal_at=save:1", "debug.signal_delay_s=1"], "save (rollout 1)"),
]


def _start(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        main_argv(run_dir, *COMMON, *overrides),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_alone(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """`_start`, returning once the run's Ray is up (its rollout manager made logs/): the next run's Ray
    starts after it, as Ray gives a starting node 30 s, which a loaded 2-core machine can exceed."""
    proc = _start(run_dir, overrides)
    deadline = time.monotonic() + 300
    while not (run_dir / "logs").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc


def _wait(proc: subprocess.Popen) -> int:
    _, stderr = proc.communicate(timeout=900)
    proc.stderr_tail = stderr[-3000:]
    return proc.returncode


def _last_phase(log: str) -> str:
    """The last phase main.log shows started (the one the kill cut: killing the run's processes first makes
    the driver's wait fail, so its teardown may begin before the driver itself dies)."""
    lines = [line for line in log.splitlines() if line.endswith(" started") and "phase teardown" not in line]
    return lines[-1].split("phase ", 1)[1].removesuffix(" started")


def _checkpoint(root: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(model weights, optimizer state) of the latest checkpoint under `root` (with LoRA: what trains)."""
    step = tracked_iteration(str(root))
    model = root / f"iter_{step:07d}" / "model"
    weights = (
        model / "model.safetensors" if (model / "model.safetensors").exists() else model / "adapter_model.safetensors"
    )
    return load_file(weights), torch.load(model.parent / "optimizer.pt", weights_only=True)


def _flat(tree, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}/").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _flat(sub, f"{prefix}{i}/").items()}
    return {prefix: tree}


def _metrics(run_dir: Path) -> list[dict]:
    """Every record of metrics.jsonl without its wall-clock timings and the push checks' probe differences."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    dropped = ("perf/", "_timestamp", *PROBE_DIFFS)
    return [{k: v for k, v in r.items() if not k.startswith(dropped)} for r in records]


def _probes(run_dir: Path) -> list[tuple[int, list[float]]]:
    """(record index, the probe's log-prob differences) of each record that holds a push check's probe. The
    probe is answered beside generation, in whatever batch the engine forms then: with a LoRA adapter served, its
    log-probs moved in the last bits with the machine's timing (4.5e-7 against 4.8e-7 on a loaded machine, equal
    on an idle one), where the run's own samples and training stay bit-identical."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    return [(i, [r[k] for k in PROBE_DIFFS]) for i, r in enumerate(records) if PROBE_DIFFS[0] in r]


@pytest.mark.parametrize(
    ("kills", "run"),
    [(KILLS, []), (KILLS[1:2], ["model.lora.rank=8"])],  # LoRA: the adapters, the norm gain and their optimizer
    ids=["full", "lora"],
)
def test_killed_mid_rollout_train_and_save_resume_bit_identical(tmp_path, kills, run):
    reference = _start_alone(tmp_path / "reference", run)
    killed = {
        name: _start_alone(tmp_path / name, [*run, *overrides, "debug.signal=SIGKILL"]) for name, overrides, _ in kills
    }
    resumed = {}
    for name, _, phase in kills:
        assert _wait(killed[name]) == -9, f"{name}: {killed[name].stderr_tail}"
        assert _last_phase((tmp_path / name / "main.log").read_text()) == phase, name
        assert tracked_iteration(str(tmp_path / name / "checkpoints")) == 0, name
        resumed[name] = _start(tmp_path / name, run)
    if "mid_save" in resumed:  # it left the data source's state of rollout 1 beside checkpoint 0; unused on resume
        assert (tmp_path / "mid_save" / "checkpoints" / "rollout" / "global_dataset_state_dict_1.pt").exists()
    assert _wait(reference) == 0, reference.stderr_tail
    ref_weights, ref_optimizer = _checkpoint(tmp_path / "reference" / "checkpoints")
    ref_metrics = _metrics(tmp_path / "reference")
    for name, proc in resumed.items():
        assert _wait(proc) == 0, f"{name}: {proc.stderr_tail}"
        result = json.loads((tmp_path / name / "result.json").read_text())
        assert (result["status"], result["start_rollout"], result["rollouts_completed"]) == ("completed", 1, 1)
        weights, optimizer = _checkpoint(tmp_path / name / "checkpoints")
        assert weights.keys() == ref_weights.keys()
        assert all(torch.equal(weights[n], ref_weights[n]) for n in weights), name
        flat, ref_flat = _flat(optimizer), _flat(ref_optimizer)
        assert flat.keys() == ref_flat.keys()
        for key, value in flat.items():
            same = torch.equal(value, ref_flat[key]) if isinstance(value, torch.Tensor) else value == ref_flat[key]
            assert same, f"{name}: optimizer {key}"
        # continuous metrics: every train step and rollout step once, in order, with the reference's values
        metrics = _metrics(tmp_path / name)
        assert [r["train/step"] for r in metrics if "train/step" in r] == list(range(NUM_ROLLOUT * K)), name
        assert [r["rollout/step"] for r in metrics if "train/step" not in r] == list(range(NUM_ROLLOUT)), name
        assert metrics == ref_metrics, name
        probes, ref_probes = _probes(tmp_path / name), _probes(tmp_path / "reference")
        assert [i for i, _ in probes] == [i for i, _ in ref_probes] and probes, name  # checked in the same steps
        pairs = [pair for (_, diffs), (_, refs) in zip(probes, ref_probes) for pair in zip(diffs, refs)]
        assert all(abs(diff - ref) < 1e-6 for diff, ref in pairs), (probes, ref_probes)
    assert_no_run_processes()
