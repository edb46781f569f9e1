"""A fake SGLang server for CPU tests: SGLang 0.5.23's own code around the hf engine's generation.

Run as SGLang is run: `python -m tests.fakes.fake_sglang --model-path P --port N --tp-size 2 ...`
(`rollout.sglang_launch.module=tests.fakes.fake_sglang`). It imports the pinned SGLang wheel
(`tests.helpers.sglang_real`) and uses its code wherever that code runs on a CPU:

- the command line: `sglang.srt.server_args.prepare_server_args` (SGLang's parser and ServerArgs; a bad
  flag exits 2 with argparse's message, as `sglang.launch_server` does);
- routes: a request to a method and path SGLang's FastAPI app does not serve answers 404; a body is built
  into the route's own request type (io_struct, or GenerateReqInput plus SGLang's JSON contract gate and
  `SamplingParams`) the way FastAPI builds it, and answers 422 (400 for /generate) when SGLang would refuse it;
- `/server_info` is `build_server_info(server_args, ...)`; `/v1/loads` is SGLang's `LoadSnapshot` (its memory section
  the model's weights);
- tensor updates: TP rank i's item is deserialised with `MultiprocessingSerializer` after
  `monkey_patch_torch_reductions` (`tp_worker.deserialize_own_rank`) and rebuilt by the model runner's
  `WeightUpdater._update_weights_from_flattened_bucket`; every rank must get the same tensors;
- LoRA adapters (`--enable-lora`): the hf engine's slot and routes (`slime/engine/hf/lora_slot.py`); a
  `/load_lora_adapter_from_tensors` body goes through SGLang's own `TpModelWorker.load_lora_adapter_from_tensors`
  once per TP rank (deserialiser, flattened bucket, `expected_checksums` check; a mismatch kills the server);
- several nodes (`--nnodes` > 1): the nodes meet at `--dist-init-addr` (a TCPStore node rank 0 hosts), node rank 0
  becomes ready only once all have joined, and a node rank >= 1 serves SGLang's own `launch_dummy_health_check_server`
  alone until node rank 0 has gone, as `Engine._launch_subprocesses` runs one (no tokenizer, no API);
- distributed updates: the group is joined through `WeightUpdater.init_weights_update_group`
  (`init_custom_process_group`), received with `receive_weights_from_distributed` and left with
  `destroy_weights_update_group` (one rank: a tp_size > 1 fake refuses distributed updates).

Generation, sessions, memory tags, `/weights_checker` and the health probe are the hf engine's, which
follows SGLang's rules (`slime/engine/hf/control.py`, `weight_receiver.py`, `weight_checker.py`). Where SGLang's
scheduler dies (release while requests run, resume of a tag that is not released, a health generation on
released memory, a TP rank without its item), this server dies too, as `run_scheduler_process`'s handler
makes SGLang's (`sglang/srt/managers/scheduler.py`): it logs `Scheduler hit an exception` and exits.

For assertions, every request other than `/generate` and the quiet reads is logged to stderr (the engine
log) as one line `FAKE_SGLANG_REQUEST {"method", "path", "body"}`, in arrival order; a `/generate` adds
`FAKE_SGLANG_GENERATE {"weight_version"}` when it arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

logger = logging.getLogger("fake_sglang")
REQUEST_MARK = "FAKE_SGLANG_REQUEST"
GENERATE_MARK = "FAKE_SGLANG_GENERATE"
CRASH_MARK = "Scheduler hit an exception"
_QUIET = {"/generate", "/health", "/health_generate", "/server_info", "/get_server_info", "/model_info"}
_QUIET |= {"/get_model_info", "/v1/loads"}


def crash(reason: str) -> None:
    """Die as SGLang does when its scheduler raises (the parent gets SIGQUIT and the server is gone)."""
    print(f"{CRASH_MARK}: {reason}", file=sys.stderr, flush=True)
    os._exit(1)


def hf_args(server_args):
    """The hf server's arguments for these ServerArgs (one CPU process, whatever tp_size says)."""
    from slime.engine.hf import server as hf_server

    argv = ["--model-path", server_args.model_path, "--host", server_args.host or "127.0.0.1"]
    argv += ["--port", str(server_args.port), "--seed", str(server_args.random_seed or 0), "--device", "cpu"]
    argv += ["--weight-version", server_args.weight_version or "default", "--batch-wait-ms", "2"]
    if server_args.context_length:
        argv += ["--context-length", str(server_args.context_length)]
    if server_args.enable_deterministic_inference:
        # SGLang turns batch-invariant kernels on for it (model_executor/model_runner.py:
        # ModelRunner.maybe_enable_batch_invariant_mode -> batch_invariant_ops.enable_batch_invariant_mode): here the
        # hf engine's same flag, its batch-invariant decoding (pinned by tests/engine/sglang/test_fake_sglang_rules.py)
        argv += ["--enable-deterministic-inference"]
    # SGLang captures routes only with this flag (state_capturer/routed_experts.py:RoutedExpertsCapturer.create
    # returns None without it) and answers return_routed_experts with meta_info.routed_experts
    # (tokenizer_manager.py, state_capturer/base.py:get_topk); the hf engine follows both, pinned by
    # tests/engine/sglang/test_sglang_engine.py and tests/train/test_routing_replay.py
    if server_args.enable_return_routed_experts:
        argv += ["--enable-return-routed-experts"]
    if server_args.enable_lora:  # the hf engine's LoRA slot serves adapters as SGLang's --enable-lora does
        argv += ["--enable-lora", "--max-lora-rank", str(server_args.max_lora_rank)]
        argv += ["--lora-target-modules", *sorted(server_args.lora_target_modules)]
    return hf_server.parse_args(argv)


def make_lora_routes_class(tp_size: int):
    """The hf engine's LoRA routes with SGLang's own adapter intake: the body prepared as
    `tokenizer_control_mixin.py:load_lora_adapter_from_tensors` prepares it (payloads normalised, a `LoRARef` id),
    then, for each TP rank, `tp_worker.py:TpModelWorker.load_lora_adapter_from_tensors` itself (its
    `deserialize_own_rank`, the flattened bucket, the `expected_checksums` check) with the model runner's load
    recording what it got; its exception kills the server, as it kills SGLang's scheduler. Every rank must get the
    same tensors; rank 0's go into the engine's slot."""
    import functools

    import torch
    from sglang.srt.lora.lora_registry import LoRARef
    from sglang.srt.managers.io_struct import LoadLoRAAdapterFromTensorsReqInput, LoRAUpdateOutput
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.common import normalize_serialized_named_tensor_payloads

    from slime.engine.hf.generator import GenerationError
    from slime.engine.hf.lora_routes import LoRARoutes
    from tests.helpers import sglang_routes

    def rank_receives(request, rank: int) -> dict:
        """What TP rank `rank`'s model runner is handed (SGLang's tp_worker code up to that call)."""
        got = {}

        def runner_load(lora_ref, tensors, config_dict, added_tokens_config=None):
            got.update({name: tensor.clone() for name, tensor in tensors.items()})
            return LoRAUpdateOutput(success=True)

        worker = SimpleNamespace(model_runner=SimpleNamespace(load_lora_adapter_from_tensors=runner_load))
        worker.deserialize_own_rank = functools.partial(TpModelWorker.deserialize_own_rank, worker)
        with get_parallel().override(tp_rank=rank):
            try:
                TpModelWorker.load_lora_adapter_from_tensors(worker, request)
            except Exception as exc:  # noqa: BLE001 - SGLang's scheduler does not catch it either
                crash(f"{type(exc).__name__}: {exc}")
        return got

    class SGLangLoRARoutes(LoRARoutes):
        def open_tensors(self, body: dict) -> dict:
            request, _ = sglang_routes.parse_body(LoadLoRAAdapterFromTensorsReqInput, body)  # the middleware checked it
            request.serialized_named_tensors = normalize_serialized_named_tensor_payloads(
                request.serialized_named_tensors
            )
            request.lora_id = LoRARef(
                lora_name=request.lora_name, lora_path="__tensor__", pinned=request.pinned
            ).lora_id
            per_rank = [rank_receives(request, rank) for rank in range(tp_size)]
            for rank, tensors in enumerate(per_rank[1:], start=1):
                same = tensors.keys() == per_rank[0].keys()
                if not same or not all(torch.equal(tensors[n], per_rank[0][n]) for n in tensors):
                    raise GenerationError(f"the adapter of TP rank {rank} differs from TP rank 0's")
            return per_rank[0]

    return SGLangLoRARoutes


def make_receiver_class():
    """The hf engine's weight receiver with SGLang's deserialiser and process-group calls."""
    import torch
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    from slime.engine.hf.weight_receiver import WeightReceiver
    from slime.engine.hf.weights import WeightLoadError

    class Recorder:
        """The model `WeightUpdater` loads into: keeps what `load_weights` is given."""

        def __init__(self):
            self.loaded: list = []

        def load_weights(self, named_tensors):
            self.loaded.extend(named_tensors)

    class SGLangWeightReceiver(WeightReceiver):
        tp_size = 1

        def open_items(self, items):
            if len(items) < self.tp_size:
                crash(f"IndexError: TP rank {len(items)} of {self.tp_size} has no serialized_named_tensors item")
            monkey_patch_torch_reductions()
            per_rank = []
            for item in items[: self.tp_size]:
                model = Recorder()
                payload = MultiprocessingSerializer.deserialize(item)
                WeightUpdater._update_weights_from_flattened_bucket(
                    SimpleNamespace(get_model=lambda m=model: m), payload
                )
                per_rank.append(model.loaded)
            for rank, loaded in enumerate(per_rank[1:], start=1):
                same = [n for n, _ in loaded] == [n for n, _ in per_rank[0]]
                if not same or not all(torch.equal(a, b) for (_, a), (_, b) in zip(loaded, per_rank[0])):
                    raise WeightLoadError(f"the bucket of TP rank {rank} differs from TP rank 0's")
            return per_rank[0]

        def join(self, address, port, rank, world_size, name, backend):
            if self.tp_size != 1:
                raise WeightLoadError("fake_sglang: distributed weight updates need --tp-size 1 (one process)")
            updater = SimpleNamespace(tp_rank=0, device="cpu", _model_update_group={})
            ok, message = WeightUpdater.init_weights_update_group(
                updater, address, port, rank, world_size, name, backend=backend
            )
            if not ok:
                raise WeightLoadError(message)
            return SimpleNamespace(updater=updater, name=name, close=lambda: self._destroy(updater, name))

        @staticmethod
        def _destroy(updater, name) -> None:
            WeightUpdater.destroy_weights_update_group(updater, name)

        def receive(self, group, names, dtypes, shapes):
            return WeightUpdater.receive_weights_from_distributed(
                group.updater, names=names, dtypes=dtypes, shapes=shapes, group_name=group.name
            )

    return SGLangWeightReceiver


def make_server(server_args):
    """The hf server behind SGLang's route table, request types and rules (see the module docstring)."""
    from aiohttp import web
    from sglang.srt.managers.load_snapshot import LoadSnapshot, MemoryMetrics
    from sglang.srt.utils.common import build_server_info
    from sglang.version import __version__

    from slime.engine.hf import server as hf_server
    from slime.engine.hf.control import ControlRuleError
    from tests.helpers import sglang_routes

    receiver_class = make_receiver_class()
    receiver_class.tp_size = int(server_args.tp_size)

    class FakeSGLangServer(hf_server.HFServer):
        lora_routes_class = make_lora_routes_class(int(server_args.tp_size))

        def __init__(self, args):
            super().__init__(args)
            self.receiver = receiver_class(self.model, self.scheduler, device=args.device)
            self.startup_time = time.time()

        async def server_info(self, request: web.Request) -> web.Response:
            info = build_server_info(server_args, {"max_req_input_len": self.generator.context_length})
            state = {
                "paused": self.scheduler.paused,
                "released_tags": sorted(self.scheduler.released_tags),
                "num_generated_tokens": self.generator.num_generated_tokens,
            }
            info.update(startup_time=self.startup_time, internal_states=[state], version=__version__)
            return web.json_response(sglang_routes.to_builtins(info))

        async def v1_loads(self, request: web.Request) -> web.Response:
            loads = self.scheduler.loads()
            # scheduler_components/load_inquirer.py fills MemoryMetrics from the model runner (GiB); this model
            # holds its weights and no KV pool or graphs, and its token capacity is its context
            weight = hf_server.memory_gib(self.model, self.args.device)["weight_gb"]
            memory = MemoryMetrics(
                weight_gb=round(weight, 3), kv_cache_gb=0.0, graph_gb=0.0, token_capacity=self.generator.context_length
            )
            snapshot = LoadSnapshot(
                timestamp=time.time(),
                num_running_reqs=loads["num_running_reqs"],
                num_waiting_reqs=loads["num_waiting_reqs"],
                memory=memory,
            )
            include = request.query.get("include")
            body = {
                "timestamp": snapshot.timestamp,
                "version": __version__,
                "accelerator": None,
                "num_accelerators": int(server_args.tp_size),
                "loads": [snapshot.to_dict(set(include.split(",")) if include else None)],
            }
            return web.json_response(body)

        @web.middleware
        async def sglang_contract(self, request: web.Request, handler) -> web.StreamResponse:
            table = sglang_routes.route_table()
            if (request.method, request.path) not in table:
                return web.json_response({"detail": "Not Found"}, status=404)
            body = await _json_or_none(request)
            _log(request, body, self.scheduler.weight_version)
            body_type = table[(request.method, request.path)]
            if body_type is not None and (body is not None or request.method != "GET"):
                _, detail = sglang_routes.parse_body(body_type, body)
                if detail is not None:
                    return web.json_response({"detail": detail}, status=422)
            if request.path == "/generate" and isinstance(body, dict):
                errors = sglang_routes.generate_errors(body)
                if errors:
                    return web.json_response({"error": "; ".join(errors)}, status=400)
            if request.path in ("/health", "/health_generate") and self.scheduler.released_tags:
                crash(f"a health generation on released memory ({sorted(self.scheduler.released_tags)})")
            try:
                return await handler(request)
            except ControlRuleError as exc:
                crash(f"{type(exc).__name__}: {exc}")
                raise

    return FakeSGLangServer(hf_args(server_args))


async def _json_or_none(request) -> Any:
    if not request.body_exists:
        return None
    try:
        return await request.json()
    except ValueError:
        return "<not JSON>"


def _log(request, body: Any, weight_version: str) -> None:
    if request.path == "/generate":
        print(f"{GENERATE_MARK} {json.dumps({'weight_version': weight_version})}", file=sys.stderr, flush=True)
    elif request.path not in _QUIET:
        line = {"method": request.method, "path": request.path, "body": _summary(body)}
        print(f"{REQUEST_MARK} {json.dumps(line)}", file=sys.stderr, flush=True)


def _summary(body: Any) -> Any:
    """The body without bulky payloads: long values as their length, serialised buckets as the names of the
    memory they point at (a CPU item's shared segment, `/torch_<producer pid>_...`; a CUDA item's GPU UUID)."""
    if not isinstance(body, dict):
        return body
    summary = {k: (v if len(json.dumps(v)) < 200 else f"<{len(json.dumps(v))} chars>") for k, v in body.items()}
    if isinstance(body.get("serialized_named_tensors"), list):
        summary["serialized_named_tensors"] = [_memory_name(item) for item in body["serialized_named_tensors"]]
    return summary


def _memory_name(item: Any) -> str:
    from slime.wire import bucket_codec

    try:
        rebuild, _ = bucket_codec.describe(item)
        if rebuild.function == "rebuild_cuda_tensor":
            return str(rebuild.args[6])
        return bucket_codec.shm_segment(rebuild)[0].removeprefix("/dev/shm")
    except Exception as exc:  # noqa: BLE001 - a bad item is the handler's to refuse; the log says what it was
        return f"<not a bucket: {type(exc).__name__}>"


async def serve(server_args) -> None:
    from aiohttp import web

    from slime.engine.hf import server as hf_server
    from slime.engine.hf.http_util import errors_as_json

    server = make_server(server_args)
    app = web.Application(client_max_size=1 << 30, middlewares=[errors_as_json, server.sglang_contract])
    await hf_server.run_app(server, app)


def _init_world() -> None:
    """A one-rank gloo world: an SGLang TP worker has its own, and `init_weights_update_group` asserts one."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(hours=1))


def follow(server_args, nodes) -> None:
    """A node rank >= 1, as `Engine._launch_subprocesses` (sglang/srt/entrypoints/engine.py) runs one: no tokenizer and
    no API, only SGLang's own `launch_dummy_health_check_server` on its port (/health, /health_generate, /ping), until
    node rank 0 goes (SGLang's ShutdownReq broadcast ends its schedulers); SIGTERM alone is only logged."""
    import signal

    from sglang.srt.utils.common import launch_dummy_health_check_server, set_prometheus_multiproc_dir

    from tests.helpers.node_rendezvous import follow_until_node_zero_is_gone

    if server_args.enable_metrics:  # engine.py _set_envs_and_config, before any metrics middleware
        set_prometheus_multiproc_dir()
    signal.signal(signal.SIGTERM, lambda *_: logger.warning("SIGTERM received on node_rank %d", server_args.node_rank))
    launch_dummy_health_check_server(server_args.host, server_args.port, server_args.enable_metrics)
    logger.info("node rank %d of %d follows node rank 0", server_args.node_rank, server_args.nnodes)
    follow_until_node_zero_is_gone(nodes, server_args.node_rank)


def main(argv: list[str] | None = None) -> None:
    from tests.helpers.sglang_real import bootstrap

    bootstrap()
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s [fake-sglang] %(message)s", force=True
    )
    from sglang.version import __version__

    logger.info(
        "ServerArgs from SGLang %s's parser: tp_size=%s port=%s model_path=%s",
        __version__,
        server_args.tp_size,
        server_args.port,
        server_args.model_path,
    )
    import torch

    torch.set_num_threads(1)
    nodes = None
    if server_args.nnodes > 1:  # SGLang's schedulers meet at --dist-init-addr (a TCPStore node rank 0 hosts)
        from tests.helpers.node_rendezvous import join_nodes

        nodes = join_nodes(server_args.dist_init_addr, num_nodes=server_args.nnodes, node_rank=server_args.node_rank)
    if nodes is not None and server_args.node_rank >= 1:
        follow(server_args, nodes)
        return
    _init_world()
    asyncio.run(serve(server_args))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
