"""The trainer side against SGLang 0.5.23's own code (the wheel of tools/setup_sglang_cpu.sh, judged in a probe
process, tests/helpers/sglang_probe.py): every request the engine client and the rollout send is a route of
SGLang's app and builds that route's own request type with no field SGLang does not have; a tensor-mode bucket
we stage is read back bit-exact by SGLang's deserialiser and weight updater; a process SGLang's own
`init_custom_process_group` joined receives our broadcasts bit-exact; and the built-in engine's weight checksums
are SGLang's WeightChecker's."""

from __future__ import annotations

import asyncio
import hashlib
import inspect

import aiohttp
import pytest
import torch

from slime.config.schema_lora import LoRAConfig
from slime.engine.client import EngineClient
from slime.engine.hf.request import VersionChange, version_spans
from slime.rollout.generate import append_engine_output, call_engine
from slime.rollout.producer import sampling_params
from slime.sync.tensor import staged
from slime.types import Sample
from slime.wire import bucket_codec
from slime.wire.weight_group import HostedWeightGroup
from tests.helpers.compose import typed_config
from tests.helpers.engines import start_engine
from tests.helpers.processes import in_thread, joined
from tests.helpers.request_recorder import RequestRecorder
from tests.helpers.sglang_probe import SGLangProbe

# Every public EngineClient method that talks to a server, called once (a new method must be added here).
CLIENT_CALLS = {
    "is_healthy": lambda c: c.is_healthy(),
    "flush_cache": lambda c: c.flush_cache(),
    "pause_generation": lambda c: c.pause_generation(),
    "continue_generation": lambda c: c.continue_generation(),
    "begin_weight_update": lambda c: c.begin_weight_update(),
    "finish_weight_update": lambda c: c.finish_weight_update("3"),
    "update_weights_from_disk": lambda c: c.update_weights_from_disk("/ckpt/hf", weight_version="3"),
    "init_weights_update_group": lambda c: c.init_weights_update_group(
        master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=3, group_name="g", backend="nccl"
    ),
    "update_weights_from_distributed": lambda c: c.update_weights_from_distributed(
        names=["model.norm.weight"], dtypes=["bfloat16"], shapes=[[64]], group_name="g", weight_version="3"
    ),
    "destroy_weights_update_group": lambda c: c.destroy_weights_update_group("g"),
    "update_weights_from_tensor": lambda c: c.update_weights_from_tensor(["aGVsbG8="], weight_version="3"),
    "check_weights": lambda c: c.check_weights("checksum"),
    "weight_digests": lambda c: c.weight_digests(),
    "server_info": lambda c: c.server_info(),
    "release_memory": lambda c: (c.release_memory(), c.release_memory(["kv_cache", "cuda_graph"])),
    "resume_memory": lambda c: c.resume_memory(["weights"]),
    "abort_all": lambda c: c.abort_all(),
    "num_requests": lambda c: c.num_requests(),
    "abort_all_and_wait_idle": lambda c: c.abort_all_and_wait_idle(timeout_s=5),
    "get_weight_version": lambda c: c.get_weight_version(),
    "loads": lambda c: c.loads(),
    "memory_gib": lambda c: c.memory_gib(),
    "load_lora_adapter_from_tensors": lambda c: c.load_lora_adapter_from_tensors(
        "policy", LoRAConfig(rank=8).adapter_config(), ["aGVsbG8="], expected_checksums={"a.lora_A.weight": "00"}
    ),
    "load_lora_adapter": lambda c: c.load_lora_adapter("policy", "/ckpt/adapter"),
    "unload_lora_adapter": lambda c: c.unload_lora_adapter("policy"),
    "update_weight_version": lambda c: c.update_weight_version("3"),
}
NOT_HTTP = {"trainer_weight_group", "prepare_disk_checkpoint"}  # the weight group's trainer end; a pushed dir


@pytest.fixture(scope="module")
def probe():
    probe = SGLangProbe.start()
    yield probe
    probe.close()


@pytest.fixture
def recorder():
    recorder = RequestRecorder().start()
    yield recorder
    recorder.stop()


def digest(tensor: torch.Tensor) -> dict:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    sha = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape), "sha256": sha}


def assert_sglang_accepts(probe: SGLangProbe, requests) -> None:
    routes = dict((path, set(methods)) for path, methods in probe.routes())
    for method, path, _query, body in requests:
        assert method in routes.get(path, set()), f"{method} {path} is not a route of SGLang 0.5.23"
        verdict = probe.check_request(method, path, body)
        assert verdict["error"] is None, f"{method} {path} {body}: {verdict['error']}"
        assert verdict["unknown"] == [], f"{method} {path}: SGLang's {verdict['type']} has no {verdict['unknown']}"


def test_every_request_of_the_engine_client_is_a_route_and_request_type_of_sglang(probe, recorder):
    methods = {name for name, _ in inspect.getmembers(EngineClient, inspect.isfunction) if not name.startswith("_")}
    assert methods - NOT_HTTP == set(CLIENT_CALLS), "every client call is checked against SGLang"
    client = EngineClient(recorder.url)
    for call in CLIENT_CALLS.values():
        call(client)
    paths = {path for _, path, _, _ in recorder.requests}
    assert {"/begin_weight_update", "/end_weight_update", "/weights_checker", "/model_info", "/v1/loads"} <= paths
    assert not paths & {"/get_weight_version", "/weights_checksum", "/get_load"}  # not routes of 0.5.23
    assert_sglang_accepts(probe, recorder.requests)
    tensor_body = next(body for _, path, _, body in recorder.requests if path == "/update_weights_from_tensor")
    verdict = probe.check_request("POST", "/update_weights_from_tensor", tensor_body)
    assert verdict["value"]["serialized_named_tensors"] == ["b'hello'"]  # base64 items decoded as SGLang does
    assert verdict["value"]["load_format"] == "flattened_bucket" and verdict["value"]["weight_version"] == "3"
    lora_body = next(body for _, path, _, body in recorder.requests if path == "/load_lora_adapter_from_tensors")
    verdict = probe.check_request("POST", "/load_lora_adapter_from_tensors", lora_body)
    assert verdict["value"]["serialized_named_tensors"] == ["b'hello'"]
    assert verdict["value"]["config_dict"]["r"] == 8 and verdict["value"]["load_format"] == "flattened_bucket"
    assert verdict["value"]["expected_checksums"] == {"a.lora_A.weight": "00"}


def test_the_rollouts_generate_request_is_sglangs(probe, recorder):
    """`call_engine`, as the default rollout calls it with the embedded run's sampling params (and the
    deterministic run's per-request seed, and routing replay's request for the routes), sends a body SGLang's
    /generate admits."""
    rollout = typed_config(["rollout.deterministic=true"]).rollout
    params = sampling_params(rollout, rollout)
    sample = Sample(prompt="What comes after 7?", index=3, tokens=[5, 6, 7])

    async def send():
        async with aiohttp.ClientSession() as session:
            args = type("Args", (), {})()
            args.config, args.router_url, args.session = rollout, recorder.url, session
            args.sampling_seed, args.request_timeout_s, args.tokenizer = 11, 30.0, None
            args.return_routed_experts = True  # such a request bypasses the router: the recorder is the worker
            args.lora_adapter = "policy"  # model.lora synced alone: every request names the policy's adapter
            args.worker_urls = [recorder.url]
            await call_engine(args, sample, params)

    asyncio.run(send())
    ((method, path, _, body),) = recorder.requests
    assert (method, path) == ("POST", "/generate") and body["sampling_params"]["sampling_seed"] > 0
    assert body["return_routed_experts"] is True and body["lora_path"] == "policy"
    assert_sglang_accepts(probe, recorder.requests)


def test_the_rollouts_generate_request_with_images_is_sglangs(probe, recorder):
    """A vision-language prompt's request: the ids with each image's tokens expanded, and its references in SGLang's
    `image_data`, a field of SGLang's GenerateReqInput that parses to the same list."""
    rollout = typed_config(["model=tiny_qwen2_5_vl"]).rollout
    params = sampling_params(rollout, rollout)
    refs = ["data:image/png;base64,iVBORw0KGgo=", "/data/images/7.png"]
    sample = Sample(prompt="x", index=3, tokens=[1, 80, 82, 82, 81, 84], images=refs)

    async def send():
        async with aiohttp.ClientSession() as session:
            args = type("Args", (), {})()
            args.config, args.router_url, args.session = rollout, recorder.url, session
            args.sampling_seed, args.request_timeout_s, args.tokenizer = None, 30.0, None
            args.return_routed_experts, args.lora_adapter, args.prompt_images = False, None, None
            await call_engine(args, sample, params)

    asyncio.run(send())
    ((method, path, _, body),) = recorder.requests
    assert body["image_data"] == refs and body["input_ids"] == sample.tokens
    assert_sglang_accepts(probe, recorder.requests)
    assert probe.check_request(method, path, body)["value"]["image_data"] == refs


def test_a_tensor_bucket_we_stage_is_read_by_sglang_bit_exact(probe):
    """Mixed dtypes and odd sizes (each tensor aligned for its view), two TP ranks, and the empty bucket."""
    torch.manual_seed(0)
    bucket = [
        ("model.layers.0.mlp.up_proj.weight", torch.randn(7, 5)),
        ("model.norm.weight", torch.randn(3).to(torch.bfloat16)),
        ("model.layers.0.self_attn.q_norm.weight", torch.randn(5, dtype=torch.float64)),
        ("step", torch.arange(3, dtype=torch.int64)),
    ]
    with staged(bucket) as item:
        ranks = probe.open_bucket([item, item])
    expected = {name: digest(tensor) for name, tensor in bucket}
    assert ranks == [expected, expected]
    flat, metadata = bucket_codec.empty_bucket()
    assert probe.open_bucket([bucket_codec.encode(flat, metadata)]) == [{}]


def test_a_process_that_joined_with_sglangs_own_group_receives_our_broadcasts_bit_exact(probe):
    torch.manual_seed(1)
    tensors = [("a.weight", torch.randn(4, 6)), ("b.bias", torch.randn(5).to(torch.bfloat16))]
    end = HostedWeightGroup(address="127.0.0.1", world_size=2, group_name="contract-g", backend="gloo", timeout_s=60)
    join = dict(master_address="127.0.0.1", master_port=end.port, rank_offset=1, world_size=2, backend="gloo")
    joiner, _ = in_thread(lambda: probe.join_group(group_name="contract-g", **join))
    group = end.join()
    joiner.join(60)
    names, dtypes = [n for n, _ in tensors], [str(t.dtype).removeprefix("torch.") for _, t in tensors]
    thread, box = in_thread(
        lambda: probe.receive(
            group_name="contract-g", names=names, dtypes=dtypes, shapes=[list(t.shape) for _, t in tensors]
        )
    )
    for _, tensor in tensors:
        group.broadcast(tensor.clone())
    assert joined(thread, box, 60) == {name: digest(tensor) for name, tensor in tensors}
    assert probe.destroy("contract-g").startswith("Succeeded")
    group.close()


def test_the_built_in_engines_checksums_are_sglangs_weight_checker(probe, tiny_model_dir, tmp_path):
    engine = start_engine(tiny_model_dir, tmp_path)
    try:
        ours = engine.client.check_weights("checksum")
    finally:
        engine.shutdown()
    sglang = probe.checksums(tiny_model_dir)
    (rank,) = ours["ranks"]
    assert rank["checksums"] == sglang["checksums"] and rank["per_gpu_checksum"] == sglang["per_gpu_checksum"]
    assert rank["parallelism_info"] == [sglang["parallelism_info"]]


def test_the_probe_judges_for_real(probe):
    """The judge refuses what SGLang refuses: an unknown route, a misspelt field, a wrong field type."""
    routes = dict(probe.routes())
    assert "/get_weight_version" not in routes and "/weights_checksum" not in routes
    verdict = probe.check_request("POST", "/init_weights_update_group", {"master_address": "a", "master_prot": 1})
    assert verdict["unknown"] == ["master_prot"] and "master_port" in verdict["error"]
    assert probe.check_request("POST", "/update_weights_from_tensor", {"serialized_named_tensors": "x"})["error"]
    generate = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "spaces_between_special_tokens": 1.5}}
    assert "expected a boolean" in probe.check_request("POST", "/generate", generate)["error"]


def test_abort_all_is_sent_again_on_every_poll_until_the_engine_is_idle():
    """Requests the router forwards after an abort still start, so each poll of /v1/loads re-sends it (slime's
    abort loop); here the engine reports requests for three polls."""

    def loads(requests):
        polls = sum(1 for _, path, _, _ in requests if path == "/v1/loads")
        return {"loads": [{"dp_rank": 0, "num_running_reqs": 1 if polls <= 3 else 0, "num_waiting_reqs": 0}]}

    recorder = RequestRecorder({"/v1/loads": loads}).start()
    try:
        EngineClient(recorder.url).abort_all_and_wait_idle(timeout_s=30, interval_s=0.01)
    finally:
        recorder.stop()
    paths = [path for _, path, _, _ in recorder.requests]
    assert paths == ["/abort_request", "/v1/loads"] * 4


def test_the_engine_memory_a_run_logs_is_read_from_sglangs_own_load_snapshot(probe):
    """SGLang's memory section (GiB per part, `MemoryMetrics`) as its /v1/loads writes it for the sections the client
    asks for; each part is the largest over the data-parallel ranks, the token capacity is not a size."""
    asked = []

    def loads(requests):
        include = requests[-1][2]["include"]
        asked.append(include)
        ranks = ([12.5, 60.25, 1.5, 400_000], [12.5, 61.0, 1.25, 410_000])
        return {"loads": [{**probe.loads_entry(memory, include), "dp_rank": i} for i, memory in enumerate(ranks)]}

    recorder = RequestRecorder({"/v1/loads": loads}).start()
    try:
        memory = EngineClient(recorder.url).memory_gib()
    finally:
        recorder.stop()
    assert asked == ["memory"]
    assert memory == {"weight": 12.5, "kv_cache": 61.0, "graph": 1.5}


def test_the_built_in_engine_serves_what_the_client_calls_and_nothing_sglang_lacks(recorder, tiny_model_dir, tmp_path):
    """The trainer side cannot tell the hf engine from SGLang: it serves every (method, path) the client calls,
    and answers 404 where SGLang 0.5.23 does (the routes of older servers)."""
    from slime.engine import http_client

    client = EngineClient(recorder.url)
    for call in CLIENT_CALLS.values():
        call(client)
    engine = start_engine(tiny_model_dir, tmp_path)
    try:
        for method, path, _query, _body in recorder.requests:
            status, _ = http_client.request(method, engine.url + path, None if method == "GET" else {}, timeout=60)
            assert status not in (404, 405), f"the hf engine does not serve {method} {path}"
        for path in ("/get_weight_version", "/weights_checksum", "/get_load"):
            assert http_client.request("GET", engine.url + path, timeout=10)[0] == 404
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "changes, current, num_tokens",
    [
        ([], "3", 5),  # no update ran across it
        ([["3", 2]], "4", 5),  # held across one update
        ([["3", 2], ["4", 2], ["5", 4]], "6", 4),  # updates with no token between them, none after the last
        ([["3", 0]], "4", 0),  # aborted before its first token
        ([["3", 7]], "3", 4),  # the same version again, changes past the end
    ],
)
def test_the_built_in_engines_token_versions_are_sglangs(probe, changes, current, num_tokens):
    """`meta_info.weight_versions` and `weight_version` of a request held across updates: the hf engine's spans
    equal what SGLang's scheduler and tokenizer manager build for the same changes, and the rollout reads each
    token's version from them."""
    meta = probe.version_meta(changes, current, num_tokens)
    spans = version_spans([VersionChange(old, n) for old, n in changes], current, num_tokens)
    assert spans == meta["weight_versions"] and spans[-1]["version"] == meta["weight_version"]
    logprobs = [[-1.0, 7]] * num_tokens
    sample = Sample(tokens=[1], response_length=0)
    append_engine_output(
        sample,
        {"text": "", "meta_info": {**meta, "output_token_logprobs": logprobs, "finish_reason": {"type": "stop"}}},
    )
    expected = [int(v) for span in meta["weight_versions"] for v in [span["version"]] * (span["end"] - span["start"])]
    assert sample.token_versions == expected and len(expected) == num_tokens
