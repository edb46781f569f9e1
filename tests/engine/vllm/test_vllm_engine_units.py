"""vLLM adapter pieces that need no server: engine specs of PD and server groups, the SGLang <-> vLLM
generate translation, and the trainer's end of vLLM's NCCL group (vLLM's module stood in for: it needs CUDA)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from slime.config import ConfigError
from slime.engine.groups import engine_specs, model_specs, policy_model
from slime.engine.vllm.client import VLLMClient
from slime.engine.vllm.engine import VLLMEngine
from slime.plan.validate import validate
from slime.sync.base import SyncContext
from slime.types import Sample, SampleStatus
from tests.helpers.compose import typed_config
from tests.helpers.vllm_real import CPU_VLLM


# ------------------------------------------------------------------------------------------ server groups
def test_prefill_num_servers_and_server_groups_give_the_engine_specs():
    """vime's --prefill-num-servers and --vllm-config on SGLang's structure: the first N servers prefill,
    the rest decode; served models with per-group overrides where only one is updated."""
    cfg = typed_config(
        [
            *CPU_VLLM,
            "cluster.rollout.num_gpus=4",
            "cluster.num_gpus_per_node=8",
            "+rollout.vllm.prefill_num_servers=1",
        ]
    )
    validate(cfg)
    assert [s.worker_type for s in engine_specs(cfg, 4)] == ["prefill", "decode", "decode", "decode"]
    models = (
        "rollout.models=[{name: actor, server_groups: [{worker_type: prefill, num_gpus: 1},"
        " {worker_type: decode, num_gpus: 2, overrides: {max_num_seqs: 8}}]},"
        " {name: ref, update_weights: false, server_groups: [{num_gpus: 1}]}]"
    )
    cfg = typed_config([*CPU_VLLM, "cluster.rollout.num_gpus=4", "cluster.num_gpus_per_node=8", models])
    validate(cfg)
    specs = engine_specs(cfg, 4)
    assert [(s.model, s.worker_type, s.overrides) for s in specs] == [
        ("actor", "prefill", {}),
        ("actor", "decode", {"max_num_seqs": 8}),
        ("actor", "decode", {"max_num_seqs": 8}),
        ("ref", "regular", {}),
    ]
    assert policy_model(model_specs(cfg)).name == "actor"
    config = VLLMEngine.config_from(cfg.rollout, worker_type=specs[1].worker_type, overrides=specs[1].overrides)
    preset = {"enforce_eager": True, "max_num_batched_tokens": 65536}  # conf/preset/embedded_vllm.yaml
    assert config.args == {**preset, "max_num_seqs": 8} and config.worker_type == "decode"
    bad = typed_config([*CPU_VLLM, "cluster.rollout.num_gpus=2", "+rollout.vllm.prefill_num_servers=2"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.prefill_num_servers"):
        validate(bad)


def test_distributed_sync_over_nccl_opens_the_trainers_end_with_vllms_own_rendezvous(monkeypatch, tmp_path):
    """On GPU the trainer joins vLLM's NCCL group through vLLM's trainer API (`nccl_common.trainer_init`, rank 0
    hosting the rendezvous on the port the engines are told), then broadcasts each tensor in the listed order.
    vLLM's `trainer_init` opens a PyNccl communicator on the current CUDA device, which this CPU machine lacks:
    its module is stood in for, the engine's HTTP calls are recorded."""
    import types

    from slime.sync.distributed import DistributedWeightSync

    calls, sent = [], []

    class Comm:
        device = "cpu"

        def broadcast(self, tensor, src, stream):
            sent.append((src, tensor.clone()))

        def destroy(self):
            calls.append(("destroy",))

    def trainer_init(info, rank):
        calls.append(("trainer_init", info, rank))
        return Comm()

    module = types.ModuleType("vllm.distributed.weight_transfer.nccl_common")
    module.trainer_init = trainer_init
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.nccl_common", module)
    monkeypatch.setattr(DistributedWeightSync, "backend", property(lambda self: "nccl"))

    class Recorded(VLLMClient):
        def _call(self, method, path, payload=None, timeout=None):
            calls.append((path, payload))
            return {"world_size": 2} if path.startswith("/get_world_size") else {"success": True}

    sync = DistributedWeightSync(
        [Recorded("http://127.0.0.1:9")], SyncContext(source_checkpoint="", work_dir="", bucket_bytes=1)
    )
    (init,) = [c for c in calls if c[0] == "/init_weight_transfer_engine"]
    (opened,) = [c for c in calls if c[0] == "trainer_init"]
    assert init[1]["init_info"]["world_size"] == 3 and init[1]["init_info"]["rank_offset"] == 1
    assert opened[1] == {
        "master_address": "127.0.0.1",
        "master_port": init[1]["init_info"]["master_port"],
        "world_size": 3,
    }
    bucket = [("a", torch.ones(2)), ("b", torch.zeros(3))]
    sync.push([bucket], weight_version=1)
    assert [(src, t.tolist()) for src, t in sent] == [(0, [1.0, 1.0]), (0, [0.0, 0.0, 0.0])]
    sync.close()
    assert ("destroy",) in calls  # the communicator is destroyed with the group (PyNcclCommunicator.destroy)


VLLM_ROUTES = """
import numpy as np, sys
from vllm.utils.serial_utils import numpy2base64
routes = (np.arange(5 * 2 * 3) % 7).reshape(5, 2, 3).astype(sys.argv[1])
print(numpy2base64(routes))
"""


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_vllms_routed_experts_become_sglangs(dtype, tmp_path):
    """`choices[0].routed_experts` as vLLM's own `numpy2base64` encodes it (a .npy file, uint8 for few experts)
    reaches the sample as SGLang's base64 of raw int32; the server flag and its model runner come with the launch."""
    from slime.engine.base import EngineLaunch
    from slime.engine.vllm.engine import VLLMEngineConfig
    from slime.engine.vllm.protocol import as_sglang_output
    from slime.models.moe.routes import decode_routes

    out = subprocess.run([sys.executable, "-c", VLLM_ROUTES, dtype], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    choice = {"token_ids": [3], "logprobs": {"content": [{"token_id": 3, "logprob": -0.5}]}}
    meta = as_sglang_output({"choices": [{**choice, "routed_experts": out.stdout.split()[-1]}]}, str)["meta_info"]
    routes = decode_routes(meta["routed_experts"], num_tokens=6, num_layers=2, topk=3)
    assert routes.tolist() == (np.arange(30) % 7).reshape(5, 2, 3).tolist()
    assert "routed_experts" not in as_sglang_output({"choices": [choice]}, str)["meta_info"]
    launch = EngineLaunch(rank=0, model_path="/m", host="h", seed=0, device="cuda", log_dir=str(tmp_path))
    for returns in (True, False):
        engine = VLLMEngine(dataclasses.replace(launch, return_routed_experts=returns), VLLMEngineConfig(args={}))
        assert engine.adapter_args().get("enable_return_routed_experts", False) is returns
        assert (engine.env().get("VLLM_USE_V2_MODEL_RUNNER") == "1") is returns


def test_sglang_sampling_params_and_responses_translate_to_and_from_vllms():
    from slime.engine.vllm.protocol import as_sglang_output, sampling_params

    params = {"max_new_tokens": 4, "top_k": -1, "sampling_seed": 3, "no_stop_trim": True, "stop_token_ids": [2]}
    assert sampling_params(params) == {
        "max_tokens": 4,
        "top_k": 0,
        "seed": 3,
        "include_stop_str_in_output": True,
        "stop_token_ids": [2],
        "logprobs": 0,
    }
    with pytest.raises(ValueError, match=r"\['json_schema'\] have no vLLM SamplingParams field"):
        sampling_params({"json_schema": "{}"})
    choice = {
        "finish_reason": "abort",
        "token_ids": [3, 4],
        "weight_versions": [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}],
    }
    choice["logprobs"] = {"content": [{"token_id": 3, "logprob": -0.5}, {"token_id": 4, "logprob": -1.5}]}
    out = as_sglang_output({"choices": [choice], "usage": {"prompt_tokens": 7}}, lambda ids: "x" * len(ids))
    assert out == {
        "text": "xx",
        "meta_info": {
            "finish_reason": {"type": "abort"},
            "output_token_logprobs": [[-0.5, 3], [-1.5, 4]],
            "weight_version": "3",  # the last span's (a request kept across an update has several)
            "weight_versions": choice["weight_versions"],  # SGLang's meta_info spans have vLLM's shape
            "prompt_tokens": 7,
            "completion_tokens": 2,
        },
    }
    sample = Sample(index=0, tokens=[1], response_length=0)
    from slime.rollout.generate import append_engine_output

    append_engine_output(sample, out)
    assert sample.status == SampleStatus.ABORTED and sample.rollout_log_probs == [-0.5, -1.5]
    assert sample.token_versions == [2, 3] and sample.response == "xx" and sample.weight_versions == ["3"]
    del choice["logprobs"]
    with pytest.raises(ValueError, match="must set sampling_params.logprobs=0"):
        as_sglang_output({"choices": [choice]}, str)


@pytest.mark.parametrize(("running", "expected"), [(0.0, 0), (1.0, 1)])
def test_a_request_vllms_count_keeps_is_in_flight_only_while_the_engine_core_schedules_one(
    monkeypatch, running, expected
):
    """GET /load says 1; the engine core's gauges (the metric lines of vLLM 0.32.0's /metrics, a longer name sharing
    their prefix among them) decide: none scheduled is idle."""
    labels = '{engine="0",model_name="tiny"}'
    metrics = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {running}",
            f"vllm:num_requests_waiting{labels} 0.0",
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 3.0',
        ]
    )
    replies = {"/load": {"server_load": 1}, "/metrics": metrics}
    client = VLLMClient("http://127.0.0.1:1")
    monkeypatch.setattr(client, "_call", lambda method, path, *args, **kwargs: replies[path])
    assert client.num_requests() == expected


def test_only_a_one_worker_cpu_server_keeps_its_worker_in_the_engine_core(tmp_path):
    from slime.engine.base import EngineLaunch, NodeSlice
    from slime.engine.vllm.engine import VLLMEngineConfig

    cpu = EngineLaunch(rank=0, model_path="/m", host="h", seed=0, device="cpu", log_dir=str(tmp_path))
    span = NodeSlice(num_nodes=2, node_rank=0, dist_init_addr="h:1")
    cases = {
        "cpu": (cpu, {}),
        "cuda": (dataclasses.replace(cpu, device="cuda", gpu_ids=("0",)), {}),
        "span": (dataclasses.replace(cpu, node_slice=span), {}),
        "pp2": (cpu, {"pipeline_parallel_size": 2}),
    }
    one_process = {
        key: VLLMEngine(launch, VLLMEngineConfig(args=args)).env().get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        for key, (launch, args) in cases.items()
    }
    assert one_process == {"cpu": True, "cuda": False, "span": False, "pp2": False}
