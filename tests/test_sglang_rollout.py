"""main.py with `rollout=sglang` on CPU (the fake SGLang server, launched as SGLang is), fault tolerance
under kill -9, and served models: two models where only one is updated, an external router and an
external engine, both left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fakes.fake_sglang import GENERATE_MARK
from tests.test_end_to_end import assert_no_run_processes, main_py

pytestmark = pytest.mark.slow

FAKE_SGLANG = ["rollout=sglang", "rollout.sglang_launch.module=tests.fakes.fake_sglang"]
SMALL = ["rollout.batch_size=16", "train.global_batch_size=64", "rollout.deterministic=false"]


def metrics(run_dir: Path) -> dict[int, dict]:
    """Per rollout id, the merged rollout-level metrics."""
    merged: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "rollout/raw_reward" in record:
            merged.setdefault(record["rollout/step"], {}).update(record)
    return merged


def generate_versions(log: Path) -> list[str]:
    text = log.read_text() if log.exists() else ""
    return [
        json.loads(line.split(" ", 1)[1])["weight_version"]
        for line in text.splitlines()
        if line.startswith(GENERATE_MARK)
    ]


def test_kill_9_of_an_engine_mid_rollout_is_survived(tmp_path):
    """Two fake SGLang engines; engine 1's server is killed (PID from engines.json) while rollout 0 runs."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "main.py", f"hydra.run.dir={run_dir}", "logger.progress=false", *FAKE_SGLANG, *SMALL]
    cmd += ["train.num_rollout=2"]
    cmd += ["cluster.rollout.num_gpus=2", "rollout.fault_tolerance.enabled=true"]
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
    finally:
        if proc.poll() is None:
            proc.kill()
    assert victim is not None, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    per_rollout = metrics(run_dir)
    killed_rollout = per_rollout[0]
    assert killed_rollout["rollout/num_prompts"] == 16 and killed_rollout["rollout/num_aborted"] == 0
    # restarted and re-synced with the others after training on rollout 0, before rollout 1
    assert [per_rollout[i]["rollout/engine_restarts"] for i in range(2)] == [1, 0]
    after = json.loads((run_dir / "engines.json").read_text())["engines"][1]
    assert after["restarts"] == 1 and after["pid"] != victim["pid"]
    versions = generate_versions(Path(after["log"]))
    assert versions[-1] == "1"  # the restarted server generated rollout 1 with the trainer's weights
    assert "removed from its router" in err
    assert_no_run_processes()


def start_external_engine(model_dir: str, log_dir: Path):
    from tests.sync.test_disk_sync import start_engine

    return start_engine(model_dir, log_dir)


def test_two_models_one_updated_behind_an_external_router_with_an_external_engine(tmp_path, tiny_model_dir):
    from slime.config.schema import RouterConfig
    from slime.engine.router import Router

    router = Router.launch(cfg=RouterConfig(), log_path=tmp_path / "external_router.log")
    external = start_external_engine(tiny_model_dir, tmp_path / "external")
    run_dir = tmp_path / "run"
    models = (
        "rollout.models=[{name: actor, server_groups: [{num_gpus: 1}]},"
        " {name: ref, update_weights: false, server_groups: [{num_gpus: 1}]}]"
    )
    try:
        proc = main_py(
            run_dir,
            *SMALL,
            "train.num_rollout=2",
            "cluster.rollout.num_gpus=2",
            models,
            f"rollout.router.address={router.url}",
            f"rollout.external_engines=[{external.url}]",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        engines = json.loads((run_dir / "engines.json").read_text())["engines"]
        assert [(e["model"], e.get("external", False)) for e in engines] == [
            ("actor", False),
            ("ref", False),
            ("actor", True),
        ]
        logs = {e["model"]: Path(e["log"]).read_text() for e in engines if "log" in e}
        assert "weight_version=2" in logs["actor"] and "Succeeded to update" not in logs["ref"]
        assert external.client.get_weight_version() == "2"  # synced like ours
        assert external.is_running() and router.process.poll() is None  # never stopped by the run
        assert router.list_workers() == []  # every engine the run registered left again
    finally:
        external.shutdown()
        router.shutdown()
