"""A fake vLLM 0.32.0 server for CPU tests: vLLM's own server code around the hf engine's generation, faking only
what a CPU vLLM cannot do (NCCL and IPC weight transfers, sleep levels).

Run as vLLM is run: `python -m tests.fakes.fake_vllm --model P --port N --tensor-parallel-size 2 ...`
(`rollout.vllm_launch.module=tests.fakes.fake_vllm`). It imports the installed vllm (0.32.0, the CPU build)
and uses its code wherever that code runs without an engine (`tests/helpers/vllm_real.py`):

- the command line: vLLM's server parser and checks (a flag vLLM rejects exits 2 with argparse's message);
- routes: those `build_app` mounts for these arguments and environment (VLLM_SERVER_DEV_MODE=1 for the dev
  and RL routes, --enable-scale-out for /inference/v1/generate: without it vLLM's own 403 answers); anything
  else is FastAPI's 404, a vLLM route the fake does not serve a 501;
- requests: query and body bound by FastAPI's binding into the handler's own parameter types (the generate
  route's `GenerateRequest` and `SamplingParams`, `init_info`, `update_info`, ...), refused with vLLM's 400;
- responses: vLLM's types (`GenerateTokensResponse`, logprobs by `ServingTokens._create_tokens_logprobs`,
  `ModelList`, `ErrorResponse`); /version is vLLM's handler;
- weight transfers: vLLM's engine classes parse `init_info` / `update_info` (`tests/fakes/fake_vllm_transfer.py`);
- several nodes (`--nnodes` > 1): the nodes meet at `--master-addr:--master-port` before node rank 0 serves; a
  `--headless` node (run as vLLM's CLI, `serve` first) serves no HTTP and ends with node rank 0.

Behind the routes the engine is the hf engine (`slime.engine.hf`) on the tiny model, in one process whatever
the parallel sizes say; where it stands in for vLLM's engine each handler names the vLLM code it follows.
A CPU vLLM refuses `--enable-sleep-mode`: sleep and wake here follow EngineCore and Executor (requests that
arrive while the engine sleeps or is paused wait, as vLLM queues them), and a write into slept weights fails
(on a GPU that memory is unmapped).

For assertions, every request other than generation and the quiet reads is logged to stderr as
`FAKE_VLLM_REQUEST {"method", "path", "query", "body"}` in arrival order, and every generate as
`FAKE_VLLM_GENERATE {"weight_version", "max_tokens", "kv_transfer_params"}` when it arrives
(`tests/helpers/fake_vllm_generate.py`: the generate route).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger("fake_vllm")
REQUEST_MARK = "FAKE_VLLM_REQUEST"
GENERATE_MARK = "FAKE_VLLM_GENERATE"
_QUIET = {"/health", "/metrics", "/load", "/server_info", "/get_world_size", "/weight_info", "/is_sleeping"}
_QUIET |= {"/is_paused", "/v1/models", "/version", "/inference/v1/generate"}
_API = "vllm.entrypoints."  # the handlers' modules, by vLLM's endpoint (module.function)
_RL = _API + "rl.online.api_router."
_DEV = _API + "serve.dev."


def hf_args(cli):
    """The hf server's arguments for vLLM's parsed command line (one CPU process; vLLM's first weight
    version is "default", `EngineCore.__init__`)."""
    from slime.engine.hf import server as hf_server

    argv = ["--model-path", cli.model, "--host", cli.host or "127.0.0.1", "--port", str(cli.port)]
    argv += ["--seed", str(cli.seed or 0), "--device", "cpu", "--weight-version", "default", "--batch-wait-ms", "2"]
    if cli.max_model_len:
        argv += ["--context-length", str(cli.max_model_len)]
    return hf_server.parse_args(argv)


def tied_behind_view(model_dir: str) -> bool:
    """Whether `model_dir` is a CPU server's untied view (slime.engine.vllm.cpu.untied_view) of a tied checkpoint: its
    files link into the checkpoint, whose config ties the head."""
    links = [p for p in Path(model_dir).iterdir() if p.is_symlink()]
    if not links:
        return False
    config = json.loads((links[0].resolve().parent / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", False))


def make_server(cli):
    """The fake server over an hf engine (torch loads here, after vLLM accepted the command line)."""
    from aiohttp import web
    from vllm.config import ParallelConfig

    from slime.engine.hf import server as hf_server
    from tests.fakes.fake_vllm_transfer import WeightTransferRoutes, WorkerError
    from tests.helpers import vllm_real
    from tests.helpers.fake_vllm_generate import GenerateRoutes

    class FakeVLLMServer(GenerateRoutes, WeightTransferRoutes, hf_server.HFServer):
        def __init__(self):
            super().__init__(hf_args(cli))
            self._load_like_vllm(cli.model)
            if cli.weight_transfer_config is not None and tied_behind_view(cli.model):
                self._tie_head()
            self.cli = cli
            self.table = vllm_real.route_table(cli)
            self.parallel = ParallelConfig(
                tensor_parallel_size=cli.tensor_parallel_size,
                pipeline_parallel_size=cli.pipeline_parallel_size,
                prefill_context_parallel_size=cli.prefill_context_parallel_size,
                data_parallel_size=cli.data_parallel_size,
            )
            self.sleeping_tags: set[str] = set()  # Executor.sleeping_tags
            self.paused = False  # the scheduler's pause state (EngineCore.is_scheduler_paused)
            self.abort_epoch = 0  # bumped by an abort of everything (requests waiting for a wake-up end too)
            self.in_flight = 0  # app.state.server_load_metrics, counted as load_aware_call counts
            self.engine_id = uuid.uuid4().hex
            self.init_transfer_state()
            self.handlers = {
                _API + "serve.instrumentator.health.health": self.health,
                _API + "serve.instrumentator.basic.get_server_load_metrics": self.load,
                "prometheus_fastapi_instrumentator.instrumentation.metrics": self.metrics,
                _API + "openai.models.api_router.show_available_models": self.models,
                _API + "scale_out.token_in_token_out.api_router.generate": self.generate,
                _DEV + "sleep.api_router.sleep": self.sleep,
                _DEV + "sleep.api_router.wake_up": self.wake_up,
                _DEV + "sleep.api_router.is_sleeping": self.is_sleeping,
                _DEV + "cache.api_router.reset_prefix_cache": self.reset_prefix_cache,
                _DEV + "rpc.api_router.collective_rpc": self.collective_rpc,
                _DEV + "server_info.api_router.show_server_info": self.server_info,
                _RL + "pause_generation": self.pause,
                _RL + "resume_generation": self.resume,
                _RL + "abort_requests": self.abort_requests,
                _RL + "is_paused": self.is_paused,
                _RL + "get_world_size": self.world_size,
                _RL + "weight_info": self.weight_info,
                **self.transfer_handlers(_RL),
            }

        def _tie_head(self) -> None:
            """Serve the head as the embedding itself, as vLLM on a GPU serves a tied checkpoint (`models/qwen3.py`:
            `Qwen3ForCausalLM.__init__` makes `lm_head` the embedding when `tie_word_embeddings`). The adapter hands
            a CPU server the untied view of a tied checkpoint (slime.engine.vllm.cpu); a fake with NCCL or IPC
            transfers stands in for a GPU server, whose pushes carry no head of its own."""
            head, embedding = self.model.get_output_embeddings(), self.model.get_input_embeddings()
            head.weight = embedding.weight  # the receiver's layout reads the attribute at each use: the embedding

        def _load_like_vllm(self, model_dir: str) -> None:
            """vLLM reads every *.safetensors file of the model directory (model_loader/default_loader.py:
            DefaultModelLoader._prepare_weights; the index only filters), transformers the index's or
            model.safetensors: an LM head in a file of its own (an untied view) would stay as initialised."""
            from slime.engine.hf.weights import load_weights_strict, read_safetensors_dir

            load_weights_strict(self.model, read_safetensors_dir(model_dir), partial=True)

        def routes(self) -> list:
            return [web.route("*", "/{tail:.*}", self.dispatch)]

        async def dispatch(self, request: web.Request) -> web.StreamResponse:
            route = self.table.get((request.method, request.path))
            if route is None:  # Starlette's answers
                known = any(path == request.path for _, path in self.table)
                detail, status = ("Method Not Allowed", 405) if known else ("Not Found", 404)
                return web.json_response({"detail": detail}, status=status)
            body = await request.read()
            _log(request, body)
            name = vllm_real.endpoint_name(route)
            handler = self.handlers.get(name)
            if handler is None:
                if vllm_real.takes_no_input(route):  # vLLM's own handler answers
                    status, payload, content_type = await vllm_real.call_endpoint(route)
                    return web.Response(status=status, body=payload, content_type=content_type)
                return _json(vllm_real.error(NotImplementedError(f"the fake vLLM server does not serve {name}")))
            try:  # a validator raising vLLM's own error (SamplingParams') escapes FastAPI's binding, as in vLLM
                params, refused = await vllm_real.bind(route, cli, request.query_string, dict(request.headers), body)
                if refused is not None:
                    return _json(refused)
                reply = await handler(request, **params)
            except WorkerError as exc:
                return _json(vllm_real.engine_call_failed(str(exc), self.parallel.world_size))
            except Exception as exc:  # noqa: BLE001 - vLLM's app turns any exception into its ErrorResponse
                logger.info("%s %s: %s: %s", request.method, request.path, type(exc).__name__, exc)
                return _json(vllm_real.error(exc))
            return reply if isinstance(reply, web.StreamResponse) else _json(reply)

        # ---- always mounted ---------------------------------------------------------------------
        async def health(self, http):
            return web.Response(status=200)

        async def load(self, http):
            return 200, {"server_load": self.in_flight}

        async def metrics(self, http):
            """The scheduler gauges of vLLM's Prometheus logger (v1/metrics/loggers.py: PrometheusStatLogger,
            `vllm:num_requests_running` / `vllm:num_requests_waiting`, labelled by engine and model), which
            VLLMClient.num_scheduled reads; the real server's are pinned by tests/engine/vllm/test_vllm_server.py."""
            labels = f'{{engine="0",model_name="{self.served_names[0]}"}}'
            lines = [
                f"vllm:num_requests_running{labels} {float(self.in_flight)}",
                f"vllm:num_requests_waiting{labels} 0.0",
            ]
            return web.Response(text="\n".join(lines) + "\n")

        async def models(self, http):
            """`OpenAIModelRegistry.show_available_models` (vllm/entrypoints/openai/models/serving.py)."""
            from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, ModelPermission

            cards = [
                ModelCard(
                    id=name, max_model_len=self.generator.context_length, root=cli.model, permission=[ModelPermission()]
                )
                for name in self.served_names
            ]
            return 200, ModelList(data=cards).model_dump()

        # ---- dev routes: vllm/v1/engine/core.py (EngineCore) and vllm/v1/executor/abstract.py (Executor)
        async def sleep(self, http, level: int, mode: str):
            """EngineCore.sleep: pause the scheduler (clearing caches from level 1), then Executor.sleep."""
            if level >= 1 and not cli.enable_sleep_mode:  # the fake's guard: vLLM releases memory only with it
                raise WorkerError("sleep mode is not enabled: start the server with --enable-sleep-mode")
            await self._pause(mode, clear_cache=level >= 1)
            if level >= 1 and "weights" not in self.sleeping_tags:
                self.sleeping_tags |= {"weights", "kv_cache"}
                await self.scheduler.run_exclusive(self.control.release_tags, ["weights", "kv_cache", "cuda_graph"])
            return 200, {"status": "sleeping", "level": level}

        async def wake_up(self, http):
            """EngineCore.wake_up and Executor.wake_up: a tag that is not asleep makes the call a no-op, scheduling
            resumes once every tag is awake."""
            tags = http.query.getall("tags", []) or None
            wake = None if tags is None else [t for t in tags if t != "scheduling"]
            if self.sleeping_tags and (wake is None or (wake and set(wake) <= self.sleeping_tags)):
                woken = set(self.sleeping_tags if wake is None else wake)
                hf_tags = [*woken, "cuda_graph"] if "kv_cache" in woken else [*woken]
                # the memory first, then the tags (vllm/v1/executor/abstract.py: Executor.wake_up): a queued request
                # that sees every tag awake must find the engine's memory back, or the engine refuses it
                await self.scheduler.run_exclusive(self.control.resume_tags, hf_tags)
                self.sleeping_tags -= woken
            awake = not self.sleeping_tags
            if awake:
                self._resume()
            return 200, {"status": "awake" if awake else "sleeping", "tags": tags}

        async def is_sleeping(self, http):
            return 200, {"is_sleeping": self.paused or bool(self.sleeping_tags)}

        async def reset_prefix_cache(self, http, reset_running_requests: bool, reset_external: bool):
            if self.scheduler.is_busy and not reset_running_requests:  # blocks still held: success false
                return 200, {"success": False}
            await self.scheduler.run_exclusive(self.control.flush_now)
            return 200, {"success": True}

        async def collective_rpc(self, http):
            """The dev route's body checks (serve/dev/rpc/api_router.py); of the workers' methods the fake runs
            `reload_weights(weights_path=...)` (Worker.reload_weights: every worker reloads in place)."""
            try:
                body = json.loads(await http.read())
            except json.JSONDecodeError as exc:
                return vllm_real.http_error(400, f"JSON decode error: {exc}")
            if not isinstance(body, dict):
                return vllm_real.http_error(400, "Request body must be a JSON object")
            if body.get("method") is None:
                return vllm_real.http_error(400, "Missing 'method' in request body")
            if body["method"] != "reload_weights":
                raise NotImplementedError(f"the fake vLLM server runs only reload_weights, not {body['method']}")
            path = (body.get("kwargs") or {}).get("weights_path")
            if "weights" in self.sleeping_tags:  # on a GPU the weights' memory is unmapped: the copy would fault
                raise WorkerError("weights are asleep: wake_up(tags=['weights']) before reloading")
            if not path or not os.path.isdir(path):
                raise WorkerError(f"weights_path {path!r} is not a directory")
            from slime.engine.hf.weights import load_weights_strict, read_safetensors_dir

            # model_loader/reload/inplace.py: reload_weights loads what the checkpoint holds and only warns about
            # parameters it does not (an untied LM head keeps its values)
            tensors = read_safetensors_dir(path)
            unloaded = sorted({name for name, _ in self.model.named_parameters()} - set(tensors))
            if unloaded:
                logger.warning("Following weights were not loaded from checkpoint: %s", unloaded)
            await self.scheduler.run_exclusive(
                functools.partial(load_weights_strict, partial=True), self.model, tensors
            )
            return 200, {"results": [None] * self.parallel.world_size}

        async def server_info(self, http, config_format: str):
            """serve/dev/server_info: a VllmConfig needs the platform's checks (a CPU vLLM refuses sleep mode),
            so only the fields the framework reads, in VllmConfig's layout."""
            config = {
                "model_config": {
                    "model": cli.model,
                    "dtype": f"torch.{self.dtype}",
                    "max_model_len": cli.max_model_len,
                },
                "parallel_config": {
                    "tensor_parallel_size": self.parallel.tensor_parallel_size,
                    "pipeline_parallel_size": self.parallel.pipeline_parallel_size,
                    "data_parallel_size": self.parallel.data_parallel_size,
                    "distributed_executor_backend": cli.distributed_executor_backend,
                },
                "cache_config": {"gpu_memory_utilization": cli.gpu_memory_utilization},
            }
            env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
            fake_cli = json.loads(json.dumps(vars(cli), default=str))
            info = {"vllm_config": config if config_format == "json" else str(config), "vllm_env": env}
            return 200, {**info, "system_env": {}, "fake_cli": fake_cli}

        # ---- RL routes: vllm/entrypoints/rl/online/api_router.py over EngineCore's pause state ---------
        async def pause(self, http, mode: str, clear_cache: bool):
            await self._pause(mode, clear_cache)
            return 200, {"status": "paused"}

        async def _pause(self, mode: str, clear_cache: bool) -> None:
            """EngineCore.pause_scheduler: "abort" ends every request, "wait" lets the running ones finish, "keep"
            freezes them (the hf engine cannot stop a batch mid-way: it finishes); new requests queue in every
            mode; caches are cleared after the drain unless "keep"."""
            await self.scheduler.pause(mode="abort" if mode == "abort" else "in_place")
            if mode == "abort":
                self.abort_epoch += 1
            while mode == "wait" and self.scheduler.is_busy:
                await asyncio.sleep(0.005)
            self.paused = True
            if clear_cache and mode != "keep":
                await self.scheduler.run_exclusive(self.control.flush_now)

        async def resume(self, http):
            self._resume()
            return 200, {"status": "resumed"}

        def _resume(self) -> None:
            self.paused = False
            self.scheduler.resume()

        async def abort_requests(self, http):
            """Empty `request_ids`: every request in flight; else those external ids (AsyncLLM.abort)."""
            try:
                body = json.loads(await http.read())
            except json.JSONDecodeError:
                return vllm_real.http_error(400, "Invalid JSON format")
            if not isinstance(body, dict):
                return vllm_real.http_error(400, "Request body must be a JSON object")
            ids = body.get("request_ids")
            if ids:
                for rid in ids:
                    self.scheduler.abort(rid=rid)
                return 200, {"status": "aborted", "aborted": len(ids)}
            self.abort_epoch += 1
            return 200, {"status": "aborted", "aborted": self.scheduler.abort(abort_all=True)}

        async def is_paused(self, http):
            return 200, {"is_paused": self.paused}

        async def world_size(self, http, include_dp: bool):
            parallel = self.parallel
            return 200, {"world_size": parallel.world_size_across_dp if include_dp else parallel.world_size}

        async def weight_info(self, http):
            return 200, {"weight_version": self.scheduler.weight_version}

        @property
        def served_names(self) -> list[str]:
            return list(cli.served_model_name or [cli.model])  # init_app_state's base model paths

    return FakeVLLMServer()


def _json(reply) -> Any:
    from aiohttp import web

    status, body = reply
    return web.json_response(body, status=int(status))


def _log(request, body: bytes) -> None:
    if request.path in _QUIET:
        return
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = "<not JSON>"
    if isinstance(payload, dict) and isinstance(payload.get("update_info"), dict):  # not the pickled handles
        payload = {"update_info": {k: v for k, v in payload["update_info"].items() if k != "ipc_handles_pickled"}}
    line = {"method": request.method, "path": request.path, "query": request.query_string, "body": payload}
    print(f"{REQUEST_MARK} {json.dumps(line)}", file=sys.stderr, flush=True)


async def serve(cli) -> None:
    from aiohttp import web

    from slime.engine.hf import server as hf_server

    server = make_server(cli)
    await hf_server.run_app(server, web.Application(client_max_size=1 << 30))


def follow_or_lead(cli):
    """Several nodes (`--nnodes` > 1): the nodes' workers meet at `--master-addr:--master-port`, torch.distributed's
    store there (vllm/distributed/parallel_state.py `init_distributed_environment`: with nnodes > 1 the init method is
    master_addr:master_port), node rank 0's, returned to be held while it serves. A `--headless` node, as
    `run_headless` (vllm/entrypoints/cli/serve.py) runs one, serves no HTTP: its workers only, until node rank 0 is
    gone (its logged line is run_headless's)."""
    from tests.helpers import vllm_real
    from tests.helpers.node_rendezvous import follow_until_node_zero_is_gone, join_nodes

    nodes = join_nodes(f"{cli.master_addr}:{cli.master_port}", num_nodes=cli.nnodes, node_rank=cli.node_rank)
    if not cli.headless:
        return nodes
    logger.info(
        "Launching vLLM (v%s) headless multiproc executor, with head node address %s:%s (node rank %d of %d)",
        vllm_real.PINNED_VERSION,
        cli.master_addr,
        cli.master_port,
        cli.node_rank,
        cli.nnodes,
    )
    follow_until_node_zero_is_gone(nodes, cli.node_rank)


def main(argv: list[str] | None = None) -> None:
    from tests.helpers import vllm_real

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # run as vLLM's CLI (`vllm serve`, a headless node): the same server parser after it
        argv = argv[1:]
    cli = vllm_real.parse_cli(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s [fake-vllm] %(message)s", force=True)
    logger.info("accepted by vLLM %s's parser: %s", vllm_real.PINNED_VERSION, " ".join(argv))
    import torch

    torch.set_num_threads(1)
    nodes = follow_or_lead(cli) if cli.nnodes > 1 else None  # node rank 0 hosts the store while it serves
    asyncio.run(serve(cli))
    del nodes
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
