"""The fake SGLang server (tests/fakes/fake_sglang.py) launched through the SGLang adapter, as a run launches it."""

from __future__ import annotations

import json

from slime.engine.base import EngineLaunch
from slime.engine.sglang.engine import SGLangEngine, SGLangEngineConfig
from tests.fakes.fake_sglang import REQUEST_MARK

FAKE = "tests.fakes.fake_sglang"


def make_engine(
    model_dir,
    log_dir,
    *,
    gpu_ids=(),
    device="cpu",
    memory_saver=False,
    timeout_s=120.0,
    routes=False,
    lora=None,
    node_slice=None,
    **config,
):
    """An SGLangEngine running the fake (tp = len(gpu_ids), 1 without); `routes`: it returns MoE routes
    (`EngineLaunch.return_routed_experts`); `lora`: the LoRA adapters it serves (`EngineLaunch.lora`); `node_slice`: one node's server of an
    engine spanning nodes (`EngineLaunch.node_slice`); `config` sets
    SGLangEngineConfig fields."""
    launch = EngineLaunch(
        rank=3,
        model_path=str(model_dir),
        host="127.0.0.1",
        seed=11,
        device=device,
        log_dir=str(log_dir),
        gpu_ids=tuple(gpu_ids),
        startup_timeout_s=timeout_s,
        shutdown_grace_s=5,
        memory_saver=memory_saver,
        return_routed_experts=routes,
        lora=lora,
        node_slice=node_slice,
    )
    fields = {"server_args": {}, "launch_module": FAKE, **config}
    return SGLangEngine(launch, SGLangEngineConfig(**fields))


def requests_logged(engine) -> list[dict]:
    """The fake's control-request lines from the engine log, in arrival order."""
    lines = engine.log_path.read_text().splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(REQUEST_MARK)]
