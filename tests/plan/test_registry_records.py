"""The facts each engine and weight-sync record carries (slime.registry.EngineFacts / WeightSyncFacts), and that a
third engine or sync mode registered through the registry API flows through the code that reads them: the
rollout's abort and generate calls, the prefill/decode split, the vLLM-on-CPU check and the weight push."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from slime.config.hooks import load_callable
from slime.driver import weight_push
from slime.driver.events import EventBus
from slime.engine import groups
from slime.engine.vllm.check import check_vllm_on_cpu
from slime.engine.vllm.engine_args import plan_line as vllm_plan_line
from slime.plan.derive import derive
from slime.plan.memory import GIB, estimate_memory, parameter_count
from slime.plan.validate import collect_problems
from slime.registry import (
    ENGINES,
    TRAIN_BACKENDS,
    WEIGHT_SYNC,
    EngineFacts,
    Spec,
    TrainBackendFacts,
    WeightSyncFacts,
    generate_protocol,
)
from slime.rollout import default, generate
from slime.rollout.base import RolloutContext
from slime.sync.base import SyncContext
from slime.sync.check import check_delta
from slime.sync.probe import TOLERANCE, probe_tolerance
from slime.types import Sample
from tests.helpers.compose import typed_config

THIRD = "third_engine"
THIRD_SYNC = "third_sync"
MEMORY_RUN = ["model=qwen3_4b", "parallelism=fsdp", "rollout=hf", "debug.gpu_memory_gib=80"]


@pytest.fixture
def third_engine():
    facts = EngineFacts(
        router="third-router",
        abort_path="/stop_everything",
        abort_all_flag=False,
        generate_protocol="slime.engine.vllm.protocol",
        prefill_decode_groups=True,
    )
    ENGINES.register(Spec(seam=ENGINES.key, name=THIRD, target="tests.nowhere.ThirdEngine", facts=facts))
    yield facts
    ENGINES.unregister(THIRD)


@pytest.fixture
def third_sync():
    facts = WeightSyncFacts(needs_tensor_handle_ranks=True, cpu_blocker="its carrier pigeons need daylight")
    WEIGHT_SYNC.register(Spec(seam=WEIGHT_SYNC.key, name=THIRD_SYNC, target="tests.nowhere.ThirdSync", facts=facts))
    yield facts
    WEIGHT_SYNC.unregister(THIRD_SYNC)


def test_the_engine_records_state_their_facts():
    hf = EngineFacts(
        kind="built-in transformers server",
        router="sglang-router",
        abort_path="/abort_request",
        abort_all_flag=True,
        lora_adapter_modes=("tensor", "disk"),
        applies_weight_deltas=True,  # slime/engine/hf/weight_receiver.py apply_delta_to
        dtype_key="hf.dtype",
        reuses_tensor_buffers=True,  # copies before replying, keeps mappings: slime/wire/kept_mappings.py
    )
    assert ENGINES.facts("hf") == hf
    assert hf.generate_protocol is None and not hf.prefill_decode_groups and hf.memory_fraction_key is None
    sglang = dataclasses.replace(
        hf,
        kind="SGLang servers",
        memory_fraction_key="sglang.mem_fraction_static",
        memory_fraction_default=0.8,
        gpu_weight_checksums=True,  # its /weights_checker hashes a GPU tensor with its triton hash
        node_span_flags=("--nnodes", "--node-rank", "--dist-init-addr"),
        applies_weight_deltas=False,
        dtype_key=None,
        reuses_tensor_buffers=False,  # copies after replying: a reused buffer would race with it
    )
    assert ENGINES.facts("sglang") == sglang
    assert ENGINES.facts("vllm") == EngineFacts(
        kind="vLLM servers",
        router="vllm-router",
        abort_path="/abort_requests",
        abort_all_flag=False,
        generate_protocol="slime.engine.vllm.protocol",
        prefill_decode_groups=True,
        memory_fraction_key="vllm.gpu_memory_utilization",
        memory_fraction_default=0.92,
        plan_line="slime.engine.vllm.engine_args.plan_line",
        lora_adapter_modes=("disk",),  # /v1/load_lora_adapter reads a directory
        node_span_flags=("--nnodes", "--node-rank", "--master-addr/--master-port"),
    )
    assert load_callable(ENGINES.facts("vllm").plan_line) is vllm_plan_line
    assert generate_protocol("vllm").GENERATE_PATH == "/inference/v1/generate"
    assert generate_protocol("sglang") is None and generate_protocol("hf") is None
    for name in ("disk", "tensor"):
        assert load_callable(WEIGHT_SYNC.facts(name).adapter_sync).mode == name


def test_the_weight_sync_records_state_their_facts():
    assert WEIGHT_SYNC.facts("disk") == WeightSyncFacts(
        needs_tensor_handle_ranks=False, cpu_blocker=None, adapter_sync="slime.sync.adapter.DiskAdapterSync"
    )
    assert WEIGHT_SYNC.facts("tensor") == WeightSyncFacts(
        needs_tensor_handle_ranks=True,
        cpu_blocker="its IPC transfer and sleep mode need an accelerator",
        adapter_sync="slime.sync.adapter.TensorAdapterSync",
        checks_adapters=True,
    )
    assert WEIGHT_SYNC.facts("distributed") == WeightSyncFacts(
        needs_tensor_handle_ranks=False, cpu_blocker="its weight-transfer engine needs an accelerator"
    )


def test_the_train_backend_records_state_their_memory_model():
    assert TRAIN_BACKENDS.facts("fsdp") == TrainBackendFacts(
        kind="PyTorch FSDP2 over a transformers model",
        fully_sharded_state=True,
        frozen_models_on_gpu=True,
        full_recompute=("gradient_checkpointing", True),
        bf16_lora_base=("fsdp.mixed_precision", "fsdp2"),
    )
    assert TRAIN_BACKENDS.facts("megatron") == TrainBackendFacts(
        kind="Megatron-core GPTModel",
        fully_sharded_state=False,
        frozen_models_on_gpu=False,
        full_recompute=("recompute.granularity", "full"),
    )


def test_every_registered_name_has_a_record_and_an_unknown_one_is_named():
    assert all(isinstance(ENGINES.facts(name), EngineFacts) for name in ENGINES.names())
    assert all(isinstance(WEIGHT_SYNC.facts(name), WeightSyncFacts) for name in WEIGHT_SYNC.names())
    assert all(isinstance(TRAIN_BACKENDS.facts(name), TrainBackendFacts) for name in TRAIN_BACKENDS.names())
    with pytest.raises(ValueError, match=r"unknown rollout engine 'vlm' \(did you mean vllm\?\)"):
        ENGINES.facts("vlm")


def test_a_name_registered_without_facts_gets_the_registry_default():
    ENGINES.register(Spec(seam=ENGINES.key, name="plain_engine", target="tests.nowhere.PlainEngine"))
    try:
        assert ENGINES.facts("plain_engine") == EngineFacts()
    finally:
        ENGINES.unregister("plain_engine")
    assert "plain_engine" not in ENGINES


def _context(engine: str) -> RolloutContext:
    return RolloutContext(
        config=SimpleNamespace(engine=engine),
        router_url="http://router",
        tokenizer=None,
        batch_size=1,
        over_sampling_batch_size=1,
        sampling_params={},
        max_in_flight=1,
        rewards=None,
        sampling_seed=None,
        session=None,
    )


def _record_posts(monkeypatch, module, answer: dict) -> list[tuple[str, dict]]:
    posts = []

    async def post_json(session, url, payload, timeout_s=None):
        posts.append((url, payload))
        return answer

    monkeypatch.setattr(module, "post_json", post_json)
    return posts


@pytest.mark.parametrize(
    ("engine", "posted"),
    [
        ("sglang", ("http://w1/abort_request", {"abort_all": True})),
        ("vllm", ("http://w1/abort_requests", {})),
        (THIRD, ("http://w1/stop_everything", {})),
    ],
)
def test_the_abort_goes_to_the_route_the_engine_record_names(monkeypatch, third_engine, engine, posted):
    posts = _record_posts(monkeypatch, default, {})
    monkeypatch.setattr(default.Router, "list_workers", lambda self: [{"url": "http://w1"}])
    asyncio.run(default._abort_engines(_context(engine)))
    assert posts == [posted]


def test_a_third_engine_with_a_generate_protocol_is_called_through_it(monkeypatch, third_engine):
    answer = {
        "choices": [
            {"finish_reason": "stop", "token_ids": [9], "logprobs": {"content": [{"token_id": 9, "logprob": -0.5}]}}
        ]
    }
    posts = _record_posts(monkeypatch, generate, answer)
    args = _context(THIRD)
    args.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "nine")
    out = asyncio.run(generate.call_engine(args, Sample(index=0, prompt="p", tokens=[1, 2]), {"max_new_tokens": 4}))
    ((url, payload),) = posts
    assert url == "http://router/inference/v1/generate"
    assert payload["token_ids"] == [1, 2] and payload["sampling_params"]["max_tokens"] == 4
    assert out["text"] == "nine" and out["meta_info"]["output_token_logprobs"][0][:2] == [-0.5, 9]


@pytest.mark.parametrize(("engine", "servers"), [("sglang", 0), ("vllm", 2), (THIRD, 2)])
def test_prefill_servers_are_read_for_engines_whose_record_splits_them(third_engine, engine, servers):
    cfg = SimpleNamespace(rollout=SimpleNamespace(engine=engine, vllm={"prefill_num_servers": 2}))
    assert groups._prefill_num_servers(cfg) == servers


def test_vllm_on_cpu_refuses_a_third_sync_with_its_records_reason(third_sync):
    cfg = SimpleNamespace(rollout=SimpleNamespace(weight_sync=SimpleNamespace(mode=THIRD_SYNC)))
    problem = next(check_vllm_on_cpu(cfg))
    assert problem.key == "rollout.weight_sync.mode" and problem.value == THIRD_SYNC
    assert "cannot take third_sync weight syncs: its carrier pigeons need daylight" in problem.message


@pytest.mark.parametrize(("mode", "ranks"), [("disk", ()), ("tensor", ((0, 1),)), (THIRD_SYNC, ((0, 1),))])
def test_the_push_asks_for_tensor_handle_ranks_when_the_sync_record_needs_them(monkeypatch, third_sync, mode, ranks):
    remote = SimpleNamespace
    manager = SimpleNamespace(
        urls=remote(remote=lambda: ["http://e1"]), tensor_handle_ranks=remote(remote=lambda: ((0, 1),))
    )
    connected = []
    actor = SimpleNamespace(connect_weight_sync=lambda *a: connected.append(a))
    monkeypatch.setattr(weight_push.ray, "get", lambda value: value)
    cfg = SimpleNamespace(
        cluster=SimpleNamespace(colocate=True),
        rollout=SimpleNamespace(
            weight_sync=SimpleNamespace(mode=mode, on_mismatch="fail", verify=False),
            fault_tolerance=SimpleNamespace(enabled=False),
        ),
    )
    context = SyncContext(source_checkpoint="/m", work_dir="/w", bucket_bytes=1)
    weight_push.WeightPush(cfg, manager, actor, context, EventBus()).connect()
    ((got_mode, urls, got_context),) = connected
    assert (got_mode, urls, got_context.tp_trainer_ranks) == (mode, ["http://e1"], ranks)


def test_deltas_and_the_probes_dtype_follow_the_engine_record_not_its_name(third_engine):
    """An engine whose record applies deltas takes delta pushes; its dtype key sets the probe's tolerance."""
    facts = EngineFacts(applies_weight_deltas=True, dtype_key="hf.dtype")
    ENGINES.register(Spec(seam=ENGINES.key, name="delta_engine", target="tests.nowhere.DeltaEngine", facts=facts))
    delta = ["rollout.weight_sync.delta=true", "rollout.weight_sync.mode=tensor"]
    try:
        ours = typed_config([*delta, "rollout.engine=delta_engine", "rollout.hf.dtype=bfloat16"])
        assert [p.key for p in check_delta(ours)] == []
        assert probe_tolerance(ours) == TOLERANCE["bf16"]  # the engine's own dtype, not the trainer's fp32
    finally:
        ENGINES.unregister("delta_engine")
    third = typed_config([*delta, f"rollout.engine={THIRD}", "rollout.hf.dtype=bfloat16"])
    assert [p.key for p in check_delta(third)] == ["rollout.engine"]


def test_the_memory_estimate_reads_a_third_engines_memory_fraction_from_its_record(third_engine):
    facts = EngineFacts(memory_fraction_key="sglang.mem_fraction_static", memory_fraction_default=0.25)
    ENGINES.register(Spec(seam=ENGINES.key, name="fraction_engine", target="tests.nowhere.FractionEngine", facts=facts))
    try:
        cfg = typed_config([*MEMORY_RUN, "rollout.engine=fraction_engine"])
        est = estimate_memory(cfg, derive(cfg))
    finally:
        ENGINES.unregister("fraction_engine")
    n, _ = parameter_count(cfg)
    assert est.engine["kv_cache"] == pytest.approx(0.25 * 80 * GIB - 2 * n)
    assert est.engine_fix == "lower rollout.sglang.mem_fraction_static"
    cfg = typed_config([*MEMORY_RUN, f"rollout.engine={THIRD}"])  # no fraction: the hf-style sequence count
    assert "rollout.hf.max_batch_size" in estimate_memory(cfg, derive(cfg)).engine_fix


OUTSIDE_SPEC = """
from slime.registry import EngineFacts, Spec

SPECS = (Spec(seam="rollout.engine", name="mine", target=".engine.Mine", facts=EngineFacts(kind="my engine")),)
"""


@pytest.mark.parametrize(
    "name,spec_text,found",
    [
        ("my_engines", OUTSIDE_SPEC, "my engine"),
        ("no_spec_engines", None, "unknown rollout engine 'no_spec_engines'"),  # a package without spec.py
        ("bad_engines", "import no_such_library_here\n", "bad_engines.spec does not import: No module named 'no_such"),
        (
            "empty_engines",
            "SPECS = ()\n",
            "empty_engines.spec declares 0 records of rollout.engine in its SPECS; it must",
        ),
    ],
)
def test_a_package_outside_slime_is_chosen_by_its_import_path(name, spec_text, found, tmp_path, monkeypatch):
    """`rollout.engine=my_engines`: its spec.py's record, its class path made absolute; a package without one is an
    unknown name, and a broken one is reported by validation saying why (never a traceback)."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    if spec_text is not None:
        (package / "spec.py").write_text(spec_text)
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = {p.key: str(p) for p in collect_problems(typed_config([f"rollout.engine={name}"]))}
    if spec_text == OUTSIDE_SPEC:
        assert ENGINES.facts(name).kind == found and ENGINES.target(name) == f"{name}.engine.Mine"
        assert "rollout.engine" not in problems
    else:
        assert found in problems["rollout.engine"]
