"""main.py with `rollout=sglang` on CPU (the fake SGLang server, launched as SGLang is, dying where SGLang's
scheduler dies): served models where only one is updated, an external router and an external engine (both
left running), and fault tolerance under kill -9, in one run; the colocated hand-off; fault tolerance with
colocation (a killed engine restarted and released before its weights are resumed); a weight push longer
than the health-probe timeout, which restarts nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.fake_sglang import GENERATE_MARK, REQUEST_MARK
from tests.helpers.compose import ROOT
from tests.helpers.engines import start_engine
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import engine_of, main_argv, main_py_concurrently, metrics, rewards

pytestmark = pytest.mark.slow

FAKE_SGLANG = ["rollout=sglang", "rollout.sglang_launch.module=tests.fakes.fake_sglang"]
SMALL = ["rollout.batch_size=16", "train.global_batch_size=64", "rollout.deterministic=false"]


def generate_versions(log: Path) -> list[str]:
    text = log.read_text() if log.exists() else ""
    return [
        json.loads(line.split(" ", 1)[1])["weight_version"]
        for line in text.splitlines()
        if line.startswith(GENERATE_MARK)
    ]


def fake_requests(log: Path) -> list[dict]:
    lines = log.read_text().splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(REQUEST_MARK)]


def test_served_models_external_router_and_engine_and_kill_9_mid_rollout(tmp_path, tiny_model_dir):
    """rollout=sglang (the fake, as SGLang is launched): an updated model "actor" of two engines behind an
    external router, plus one external engine; a frozen model "ref" of one engine. Engine 1's server is
    killed (kill -9, PID from engines.json) while rollout 0 runs; the run must complete."""
    from slime.config.schema import RouterConfig
    from slime.engine.router import Router

    router = Router.launch(cfg=RouterConfig(), log_path=tmp_path / "external_router.log")
    external = start_engine(tiny_model_dir, tmp_path / "external")
    run_dir = tmp_path / "run"
    models = (
        "rollout.models=[{name: actor, server_groups: [{num_gpus: 2}]},"
        " {name: ref, update_weights: false, server_groups: [{num_gpus: 1}]}]"
    )
    cmd = main_argv(run_dir, *FAKE_SGLANG, *SMALL)
    cmd += ["train.num_rollout=2", "cluster.rollout.num_gpus=3", models, f"rollout.router.address={router.url}"]
    cmd += [f"rollout.external_engines=[{external.url}]", "rollout.fault_tolerance.enabled=true"]
    cmd += ["rollout.fault_tolerance.health_check_interval_s=0.3", "rollout.max_response_len=8"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        deadline = time.monotonic() + 300
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            if not (run_dir / "engines.json").exists():
                continue
            engine = json.loads((run_dir / "engines.json").read_text())["engines"][1]
            if generate_versions(Path(engine["log"])).count("0") >= 10:  # rollout 0 is under way on engine 1
                os.kill(engine["pid"], signal.SIGKILL)
                victim = engine
        out, err = proc.communicate(timeout=300)
        assert victim is not None, err[-3000:]
        assert proc.returncode == 0, err[-3000:]
        per_rollout = metrics(run_dir)
        # every prompt of the killed rollout trained once: none lost, none doubled, no aborted sample
        assert per_rollout[0]["rollout/num_prompts"] == 16 and per_rollout[0]["rollout/num_aborted"] == 0
        # restarted and re-synced with the others after training on rollout 0, before rollout 1
        assert [per_rollout[i]["rollout/engine_restarts"] for i in range(2)] == [1, 0]
        assert "removed from its router" in err
        engines = json.loads((run_dir / "engines.json").read_text())["engines"]
        assert [(e["model"], e.get("external", False)) for e in engines] == [
            ("actor", False),
            ("actor", False),
            ("ref", False),
            ("actor", True),
        ]
        assert engines[1]["restarts"] == 1 and engines[1]["pid"] != victim["pid"]
        versions = generate_versions(Path(engines[1]["log"]))  # the restarted server's: rollout 1 on the new weights,
        assert versions.count("1") > 1 and versions[-1] == "2", versions  # then the probe of the last push
        synced = lambda e: [r for r in fake_requests(Path(e["log"])) if r["path"].startswith("/update_weights")]  # noqa: E731
        assert synced(engines[0]) and synced(engines[1]) and not synced(engines[2])  # only "actor" is updated
        assert external.client.get_weight_version() == "2"  # synced like ours
        assert external.is_running() and router.process.poll() is None  # never stopped by the run
        assert router.list_workers() == []  # every engine the run registered left again
    finally:
        if proc.poll() is None:
            proc.kill()
        external.shutdown()
        router.shutdown()
    assert_no_run_processes()  # the run's own engines, routers and Ray processes are gone


def test_colocated_hand_off_order_and_tensor_sync(tmp_path):
    """cluster.colocate=true, two training ranks and one engine of TP 2 on their two devices: the driver's
    hand-off steps (logged in main.log) and the engine's own request log follow
    docs/architecture.md#colocated-hand-off; each TP rank gets the bucket staged by the training rank on its device;
    the engine runs the trainer's weights."""
    run_dir = tmp_path / "run"
    cmd = main_argv(run_dir, *FAKE_SGLANG, *SMALL)
    cmd += ["train.num_rollout=2", "cluster.colocate=true", "rollout.weight_sync.mode=tensor"]
    cmd += ["cluster.actor.num_gpus_per_node=2", "cluster.rollout.num_gpus_per_engine=2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = handoff_steps(run_dir)
    push = ["train_offload", "engine_resume_weights", "weight_sync", "engine_resume_kv_cache"]
    before_train = ["engine_release", "train_onload"]
    expected = [(-1, s) for s in push] + [(i, s) for i in (0, 1) for s in before_train + push]
    assert steps == expected
    engine = json.loads((run_dir / "engines.json").read_text())["engines"][0]
    memory = [
        (r["path"], (r["body"] or {}).get("tags"))
        for r in fake_requests(Path(engine["log"]))
        if "memory" in r["path"] or r["path"] == "/update_weights_from_tensor"
    ]
    release = ("/release_memory_occupation", None)
    one_push = [("/resume_memory_occupation", ["weights"]), ("/update_weights_from_tensor", None)]
    one_push += [("/resume_memory_occupation", ["kv_cache", "cuda_graph"])]
    # released once up (the trainer builds), then per step: push ... release before training
    assert memory[0] == release and memory[1] == one_push[0] and memory[-1] == one_push[-1]
    assert [m for m in memory if m[0] != "/update_weights_from_tensor"] == [
        release,
        one_push[0],
        one_push[2],
        release,
        one_push[0],
        one_push[2],
        release,
        one_push[0],
        one_push[2],
    ]
    assert "--enable-memory-saver" in Path(engine["log"]).read_text()
    handles = [
        r["body"]["serialized_named_tensors"]
        for r in fake_requests(Path(engine["log"]))
        if r["path"] == "/update_weights_from_tensor"
    ]
    # one item per TP rank, each staged by the training rank on that rank's device: the fake logs the shared
    # segment each item names, /torch_<producer pid>_...
    producers = [{name.split("_")[1] for name in items} for items in handles]
    assert handles and all(len(items) == 2 and len(pids) == 2 for items, pids in zip(handles, producers))
    diffs = [
        json.loads(line)["train/train_rollout_logprob_abs_diff"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "train/train_rollout_logprob_abs_diff" in line
    ]
    assert diffs and max(diffs) < 1e-5  # the engine generated with exactly the trainer's weights
    # each step logs SGLang's memory section, read after generation (the tiny model's weights round to 0.000 GiB)
    memory_keys = {"perf/engine_gib/weight", "perf/engine_gib/kv_cache", "perf/engine_gib/graph"}
    assert all(memory_keys <= set(step) for step in metrics(run_dir).values())


def handoff_steps(run_dir: Path) -> list[tuple[int, str]]:
    """The colocated hand-off's steps as the driver logged them (slime.driver.weight_push), in order."""
    found = re.findall(r"hand-off step (\w+) \(rollout (-?\d+)\)", (run_dir / "main.log").read_text())
    return [(int(rollout_id), step) for step, rollout_id in found]


def test_colocated_fault_tolerance_releases_a_restarted_engine_before_resuming_its_weights(tmp_path):
    """cluster.colocate=true with fault tolerance, two engines; engine 1 is killed (kill -9) while rollout 0 runs.
    The push after training restarts it once the trainer is offloaded; it releases its memory at once, so that
    resuming "weights" then the KV cache is what SGLang accepts (the fake dies, as SGLang's scheduler does, on
    a resume of a tag that is not released). The run completes, every prompt trained once."""
    run_dir = tmp_path / "run"
    cmd = main_argv(run_dir, *FAKE_SGLANG, *SMALL, "train.num_rollout=2", "cluster.colocate=true")
    cmd += ["cluster.actor.num_gpus_per_node=2", "rollout.max_response_len=8", "rollout.fault_tolerance.enabled=true"]
    cmd += ["rollout.fault_tolerance.health_check_interval_s=0.3"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = engine_of(run_dir, 1)
        deadline = time.monotonic() + 300
        while generate_versions(Path(victim["log"])).count("0") < 10:  # rollout 0 is under way on engine 1
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        per_rollout = metrics(run_dir)
        assert per_rollout[0]["rollout/num_prompts"] == 16 and per_rollout[0]["rollout/num_aborted"] == 0
        assert [per_rollout[i]["rollout/engine_restarts"] for i in range(2)] == [1, 0]
        push = ["engine_resume_weights", "weight_sync", "engine_resume_kv_cache"]
        assert [step for rollout_id, step in handoff_steps(run_dir) if rollout_id == 0] == [
            "engine_release",
            "train_onload",
            "train_offload",
            "engine_restart",  # after the trainer left the GPUs
            *push,
        ]
        restarted = engine_of(run_dir, 1)
        assert restarted["restarts"] == 1 and restarted["pid"] != victim["pid"]
        memory = [
            (r["path"], (r["body"] or {}).get("tags"))
            for r in fake_requests(Path(restarted["log"]))
            if "memory" in r["path"]
        ]
        release, weights = ("/release_memory_occupation", None), ("/resume_memory_occupation", ["weights"])
        rest = ("/resume_memory_occupation", ["kv_cache", "cuda_graph"])
        # one log file for both processes of engine 1: the killed one (up, first push), then the restarted one
        assert memory == [release, weights, rest] + [
            release,  # at once, as slime's recovery does
            weights,
            rest,
            release,  # before training on rollout 1
            weights,
            rest,
        ]
        versions = generate_versions(Path(restarted["log"]))  # rollout 1 on the new weights, then the last push's probe
        assert versions.count("1") > 1 and versions[-1] == "2", versions
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_no_run_processes()


def test_a_weight_push_longer_than_the_probe_timeout_restarts_no_engine(tmp_path):
    """Fault tolerance with the shortest probe timeout validation allows for the engines' health timeout
    (SGLANG_HEALTH_CHECK_TIMEOUT=3 -> 8 s) and probes every 0.3 s. Engine 0's server is frozen (SIGSTOP) for
    longer than that as soon as the first weight push pauses it, so the push lasts longer than a probe may:
    the probes rest during the push, no engine is taken out or restarted, and the run completes."""
    run_dir = tmp_path / "run"
    probe_timeout_s = 8.0
    cmd = main_argv(run_dir, *FAKE_SGLANG, *SMALL, "train.num_rollout=1", "cluster.rollout.num_gpus=2")
    cmd += ["rollout.max_response_len=8", "rollout.fault_tolerance.enabled=true"]
    cmd += ["rollout.fault_tolerance.health_check_interval_s=0.3"]
    cmd += [f"rollout.fault_tolerance.health_check_timeout_s={probe_timeout_s}"]
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "3"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        engine = engine_of(run_dir, 0)
        deadline = time.monotonic() + 300
        while not [r for r in fake_requests(Path(engine["log"])) if r["path"] == "/pause_generation"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        os.kill(engine["pid"], signal.SIGSTOP)  # the push now waits on engine 0
        try:
            time.sleep(probe_timeout_s + 2)  # the scenario: a push longer than a probe may take
        finally:
            os.kill(engine["pid"], signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert metrics(run_dir)[0]["rollout/engine_restarts"] == 0
        assert "removed from its router" not in err
        assert [e["restarts"] for e in json.loads((run_dir / "engines.json").read_text())["engines"]] == [0, 0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_no_run_processes()


LEARN_ROLLOUTS = 60  # the embedded run's length
SAME_AS_HF_STEPS = 10  # the built-in engine's run of the same seed, step for step
LEARN_RUNS = {  # rollout=sglang with each weight-sync mode
    "distributed": [*FAKE_SGLANG, "debug.check_weight_update_equal=true"],
    "disk": [*FAKE_SGLANG, "rollout.weight_sync.mode=disk", "debug.check_weight_update_equal=true"],
    "tensor": [*FAKE_SGLANG, "rollout.weight_sync.mode=tensor", "cluster.colocate=true"],
}


@pytest.mark.timeout(2400)  # three 60-rollout runs side by side, then the short hf run, on 2 busy cores
def test_every_weight_sync_mode_learns_as_the_embedded_default(tmp_path):
    """`rollout=sglang` on the fake with the distributed, disk and colocated tensor syncs, deterministic as the
    embedded default: each learns the task to a last-3 mean of 0.8, all three with the same reward at every step,
    and the first 10 steps' rewards are the built-in engine's run of the same seed (the fake's generation is the hf
    engine's, so a difference is a sync's: a weight not delivered, a version not stamped). The distributed and disk
    runs also check every push (debug.check_weight_update_equal: the engines snapshot and randomise the
    checkpoint's weights once up, the first push must restore them bit-exact), beside the verification every push
    gets by default."""

    runs = {
        key: (tmp_path / key, [*overrides, f"train.num_rollout={LEARN_ROLLOUTS}"])
        for key, overrides in LEARN_RUNS.items()
    }
    runs["hf"] = (tmp_path / "hf", [f"train.num_rollout={SAME_AS_HF_STEPS}"])
    procs = main_py_concurrently(runs, max_workers=3, timeout=1800)
    for key, proc in procs.items():
        assert proc.returncode == 0, f"{key}: {proc.stderr[-3000:]}"
    for key in LEARN_RUNS:
        record(f"sglang_{key}", tmp_path / key, procs[key])
    reference = rewards(tmp_path / "distributed")
    assert len(reference) == LEARN_ROLLOUTS and reference[0] <= 0.1, reference
    assert sum(reference[-3:]) / 3 >= 0.8, reference  # it learns, as the embedded default does
    for key in ("disk", "tensor"):
        assert rewards(tmp_path / key) == reference, key
    assert rewards(tmp_path / "hf") == reference[:SAME_AS_HF_STEPS]
    for key in ("distributed", "disk"):
        engine = json.loads((tmp_path / key / "engines.json").read_text())["engines"][0]
        checks = [r["body"]["action"] for r in fake_requests(Path(engine["log"])) if r["path"] == "/weights_checker"]
        # once up: snapshot and randomise; every push: the first one compared with the snapshot, the engines agree,
        # and then (after the push, beside the rollout) verified: the engine's checksums against the trainer's digests
        first = ["compare", "checksum", "checksum"]
        assert checks == ["snapshot", "reset_tensors", *first, *["checksum", "checksum"] * LEARN_ROLLOUTS], key
    assert_no_run_processes()
