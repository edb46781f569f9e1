"""main.py with `rollout=vllm` on CPU (the fake vLLM server, launched as vLLM is, behind the real vllm-router):
served models where only one is updated, an external router (left running), and fault tolerance under kill -9,
in one run. The fake because the run syncs weights the way `rollout=vllm` does by default (distributed: vLLM's
NCCL transfer engine, which needs an accelerator on a CPU vLLM); kill -9, engines.json and the external router
tests/e2e/test_vllm_real.py covers on the real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.fake_vllm import GENERATE_MARK, REQUEST_MARK
from tests.helpers.compose import ROOT
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_argv

pytestmark = pytest.mark.slow

FAKE_VLLM = ["rollout=vllm", "rollout.vllm_launch.module=tests.fakes.fake_vllm"]
SMALL = ["rollout.batch_size=16", "train.global_batch_size=64", "rollout.deterministic=false"]


def generate_versions(log: Path) -> list[str]:
    text = log.read_text() if log.exists() else ""
    return [json.loads(x.split(" ", 1)[1])["weight_version"] for x in text.splitlines() if x.startswith(GENERATE_MARK)]


def update_calls(log: Path) -> int:
    lines = log.read_text().splitlines()
    return sum(json.loads(x.split(" ", 1)[1])["path"] == "/update_weights" for x in lines if x.startswith(REQUEST_MARK))


def test_served_models_external_router_and_kill_9_mid_rollout(tmp_path):
    """An updated model "actor" of two vLLM servers behind an external vllm-router and a frozen model "ref"; the
    actor's second server is killed (kill -9, PID from engines.json) while rollout 0 runs: it leaves the router,
    restarts, gets the trainer's weights before it rejoins, and the run completes with no prompt lost. Fake only
    for the NCCL weight transfer (a CPU vLLM's transfer engine needs an accelerator); tests/e2e/test_vllm_real.py
    covers kill -9 on the real server."""
    from slime.config.schema import RouterConfig
    from slime.engine.vllm.router import VLLMRouter

    router = VLLMRouter.launch(cfg=RouterConfig(), log_path=tmp_path / "external_router.log")
    run_dir = tmp_path / "run"
    models = (
        "rollout.models=[{name: actor, server_groups: [{num_gpus: 2}]},"
        " {name: ref, update_weights: false, server_groups: [{num_gpus: 1}]}]"
    )
    cmd = main_argv(run_dir, *FAKE_VLLM, *SMALL)
    cmd += ["train.num_rollout=2", "cluster.rollout.num_gpus=3", models, f"rollout.router.address={router.url}"]
    cmd += ["rollout.fault_tolerance.enabled=true", "rollout.fault_tolerance.health_check_interval_s=0.3"]
    cmd += ["rollout.max_response_len=8"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        deadline = time.monotonic() + 300
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            if not (run_dir / "engines.json").exists():
                continue
            engine = json.loads((run_dir / "engines.json").read_text())["engines"][1]
            if generate_versions(Path(engine["log"])).count("0") >= 10:  # rollout 0 is under way on server 1
                os.kill(engine["pid"], signal.SIGKILL)
                victim = engine
        out, err = proc.communicate(timeout=300)
        assert victim is not None, err[-3000:]
        assert proc.returncode == 0, err[-3000:]
        steps = {}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if "rollout/engine_restarts" in record:
                steps[record["rollout/step"]] = record
        assert steps[0]["rollout/num_prompts"] == 16 and steps[0]["rollout/num_aborted"] == 0
        assert [steps[i]["rollout/engine_restarts"] for i in range(2)] == [1, 0]
        # the log-prob probes: both actor engines' tokens, scored by the trainer (fp32: far below 1e-3); the probe of
        # the push after step 0 ran beside rollout 1 and is in step 1's record, with the last push's
        probed = [
            steps[i]["rollout/weight_probe_logprob_diff"]
            for i in range(2)
            if "rollout/weight_probe_logprob_diff" in steps[i]
        ]
        assert "rollout/weight_probe_logprob_diff" in steps[1] and max(probed) < 1e-5, steps
        assert "removed from its router" in err
        engines = json.loads((run_dir / "engines.json").read_text())["engines"]
        assert [(e["model"], e["kind"]) for e in engines] == [("actor", "vllm"), ("actor", "vllm"), ("ref", "vllm")]
        assert engines[1]["restarts"] == 1 and engines[1]["pid"] != victim["pid"]
        versions = generate_versions(Path(engines[1]["log"]))  # the restarted server's: rollout 1 on the new weights,
        assert versions.count("1") > 1 and versions[-1] == "2", versions  # then the probe of the last push
        logs = [Path(e["log"]) for e in engines]
        assert update_calls(logs[0]) and update_calls(logs[1]) and not update_calls(logs[2])  # only "actor"
        assert router.process.poll() is None and router.list_workers() == []  # left running, every worker gone
    finally:
        if proc.poll() is None:
            proc.kill()
        router.shutdown()
    assert_no_run_processes()
