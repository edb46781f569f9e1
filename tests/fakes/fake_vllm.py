"""A fake vLLM 0.33.0 server for CPU tests: vLLM's CLI and HTTP contract, the hf engine's real generation.

Run as vLLM is run: `python -m tests.fakes.fake_vllm --model P --port N --tensor-parallel-size 2 ...`
(`rollout.vllm_launch.module=tests.fakes.fake_vllm`). The command line is parsed as vLLM's server parses
it: one option per argument of the pinned field list (`slime/engine/vllm/engine_args_fields.json`), bools
as `--flag` / `--no-flag`, config and dict arguments as one JSON value, so an argument vLLM would reject
fails here too (exit status 2). The routes and payloads are vLLM 0.33.0's (read from its sources):

    always              GET /health, /metrics, /load, /v1/models, /version; POST /inference/v1/generate
    VLLM_SERVER_DEV_MODE=1 only (else 404, as vLLM mounts them only then):
      dev               POST /sleep?level=, /wake_up?tags=, GET /is_sleeping, POST /reset_prefix_cache,
                        POST /collective_rpc {method, args, kwargs} (method "reload_weights"), GET /server_info
      RL                POST /pause?mode=, /resume, /abort_requests, GET /is_paused, POST
                        /init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update,
                        /shutdown_weight_transfer_engine, /update_weight_version, GET /weight_info, /get_world_size

Generation, weight loading and the broadcast group are the hf engine's (`slime.engine.hf`) on the tiny model,
in one process whatever the parallel sizes say (the RL weight-transfer routes live in
`tests/fakes/fake_vllm_transfer.py`). The weight transfer backends are `--weight-transfer-config`'s:
"nccl" joins the trainer's group (gloo on CPU, `slime.sync.wire`), "ipc" opens packed buckets whose handle
key is "cpu" (a /dev/shm file: (path, nbytes)) and needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 for the pickled
handles, as vLLM. Sleeping servers refuse generation (503) and weight writes into slept weights (500), the
failures a wrong hand-off order causes on a GPU. A PD prefill (`--kv-transfer-config`, request
`kv_transfer_params.do_remote_decode`) answers with `kv_transfer_params` for the decode server.

For assertions, every control request is logged to stderr as `FAKE_VLLM_REQUEST {"method", "path", "query",
"body"}` in arrival order, and every generate as `FAKE_VLLM_GENERATE {"weight_version", "max_tokens",
"kv_transfer_params"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from typing import Any

from slime.engine.vllm.engine_args import FIELDS_FILE, JSON_LISTS, REPEATED

logger = logging.getLogger("fake_vllm")
REQUEST_MARK = "FAKE_VLLM_REQUEST"
GENERATE_MARK = "FAKE_VLLM_GENERATE"
_QUIET = {"/health", "/metrics", "/load", "/server_info", "/get_world_size", "/weight_info", "/is_sleeping"}
_QUIET |= {"/is_paused", "/v1/models", "/version", "/inference/v1/generate"}
# vLLM SamplingParams field -> the hf engine's (SGLang-named) sampling param
_SAMPLING = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "sampling_seed",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "include_stop_str_in_output": "no_stop_trim",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def build_parser() -> argparse.ArgumentParser:
    """vLLM's server CLI from the pinned field list (argparse rejects what vLLM's parser rejects)."""
    fields = json.loads(FIELDS_FILE.read_text())["fields"]
    parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    for name, spec in fields.items():
        flag, annotation = spec["flag"], spec.get("type", "")
        simple = annotation.removesuffix(" | None")
        if simple == "bool":
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction)
        elif simple == "int":
            parser.add_argument(flag, dest=name, type=int)
        elif simple == "float":
            parser.add_argument(flag, dest=name, type=float)
        elif name in JSON_LISTS or simple.endswith("Config") or simple.startswith("dict["):
            parser.add_argument(flag, dest=name, type=json.loads)
        elif name in REPEATED:
            parser.add_argument(flag, dest=name, action="append")
        elif simple.startswith("list["):
            parser.add_argument(flag, dest=name, nargs="+")
        else:
            parser.add_argument(flag, dest=name)
    return parser


def hf_args(cli: argparse.Namespace) -> argparse.Namespace:
    from slime.engine.hf import server as hf_server

    argv = ["--model-path", cli.model, "--host", cli.host or "127.0.0.1", "--port", str(cli.port)]
    argv += ["--seed", str(cli.seed or 0), "--device", "cpu", "--weight-version", "0", "--batch-wait-ms", "2"]
    if cli.max_model_len:
        argv += ["--context-length", str(cli.max_model_len)]
    return hf_server.parse_args(argv)


def make_server(cli: argparse.Namespace):
    """The fake server over an hf engine (torch loads here, after the command line was accepted)."""
    from aiohttp import web

    from slime.engine.hf import server as hf_server
    from slime.engine.hf.protocol import parse_generate
    from slime.engine.hf.weights import load_weights_strict, read_safetensors_dir
    from tests.fakes.fake_vllm_transfer import WeightTransferRoutes, error

    class FakeVLLMServer(WeightTransferRoutes, hf_server.HFServer):
        def __init__(self):
            super().__init__(hf_args(cli))
            self.cli = cli
            self.dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
            self.sleeping: set[str] = set()  # asleep tags: weights, kv_cache
            self.paused = ""  # "" | abort | wait | keep
            self.in_flight = 0
            self.engine_id = uuid.uuid4().hex
            self.init_transfer_state()

        def routes(self) -> list:
            routes = [
                web.get("/health", self.health),
                web.get("/metrics", self.metrics),
                web.get("/load", self.load),
                web.get("/v1/models", self.models),
                web.get("/version", lambda r: web.json_response({"version": "0.33.0"})),
                web.post("/inference/v1/generate", self.generate_tokens),
            ]
            if not self.dev:
                return routes
            dev = {
                "/sleep": self.sleep,
                "/wake_up": self.wake_up,
                "/reset_prefix_cache": self.reset_prefix_cache,
                "/collective_rpc": self.collective_rpc,
                "/pause": self.pause,
                "/resume": self.resume,
                "/abort_requests": self.abort_requests,
                **self.transfer_routes(),
            }
            gets = {
                "/is_sleeping": lambda r: web.json_response({"is_sleeping": bool(self.sleeping)}),
                "/is_paused": lambda r: web.json_response({"is_paused": bool(self.paused)}),
                "/weight_info": lambda r: web.json_response({"weight_version": self.scheduler.weight_version}),
                "/get_world_size": self.world_size,
                "/server_info": self.server_info,
            }
            return [
                *routes,
                *(web.post(p, h) for p, h in dev.items()),
                *(web.get(p, h) for p, h in gets.items()),
            ]

        # ---- always mounted ---------------------------------------------------------------------
        async def health(self, request):
            return web.Response(text="")

        async def metrics(self, request):
            return web.Response(text=f"vllm:num_requests_running {self.in_flight}\n")

        async def load(self, request):
            return web.json_response({"server_load": self.in_flight if cli.enable_server_load_tracking else 0})

        async def models(self, request):
            name = cli.served_model_name or cli.model
            return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "root": cli.model}]})

        async def generate_tokens(self, request):
            body = await request.json()
            if not isinstance(body.get("token_ids"), list) or not body["token_ids"]:
                return error("token_ids: List should have at least 1 item", 400)
            if body.get("model") not in (None, cli.served_model_name or cli.model):
                return error(f"The model `{body['model']}` does not exist.", 404, "NotFoundError")
            if self.paused in ("abort", "wait"):
                return error("Generation is paused; retry after /resume", 503, "ServiceUnavailableError")
            if "kv_cache" in self.sleeping or "weights" in self.sleeping:
                return error("The engine is sleeping; call /wake_up first", 503, "ServiceUnavailableError")
            sp = body.get("sampling_params") or {}
            params = {_SAMPLING[k]: v for k, v in sp.items() if k in _SAMPLING and v is not None}
            params.setdefault("max_new_tokens", 16)  # vLLM's SamplingParams.max_tokens default
            if params.get("top_k") == 0:
                params["top_k"] = -1
            kv = body.get("kv_transfer_params")
            if kv and cli.kv_transfer_config is None:
                return error("kv_transfer_params needs a server started with --kv-transfer-config", 400)
            mark = {"weight_version": self.scheduler.weight_version, "max_tokens": params["max_new_tokens"]}
            print(f"{GENERATE_MARK} {json.dumps({**mark, 'kv_transfer_params': kv})}", file=sys.stderr, flush=True)
            call = parse_generate({"input_ids": body["token_ids"], "sampling_params": params}, self.tokenizer.encode)
            self.in_flight += 1
            try:
                (done,) = await self.scheduler.submit(call.requests)
            finally:
                self.in_flight -= 1
            return web.json_response(self._tokens_response(body, sp, done, kv))

        def _tokens_response(self, body: dict, sp: dict, done, kv: Any) -> dict:
            res = done.result
            content = None
            if sp.get("logprobs") is not None:
                content = [
                    {"token_id": t, "logprob": lp, "rank": None, "top_logprobs": []}
                    for lp, t in zip(res.output_logprobs, res.output_ids)
                ]
            version = done.weight_version
            reply_kv = None
            if kv and kv.get("do_remote_decode"):  # this server prefilled for a decode server
                reply_kv = {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_engine_id": self.engine_id,
                    "remote_block_ids": list(range(len(body["token_ids"]) // 16 + 1)),
                    "remote_host": cli.host,
                    "remote_port": int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "0")),
                }
            n = len(res.output_ids)
            return {
                "request_id": body.get("request_id") or uuid.uuid4().hex,
                "model": cli.served_model_name or cli.model,
                "created": int(time.time()),
                "usage": {"prompt_tokens": len(body["token_ids"]), "completion_tokens": n, "total_tokens": n},
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": res.finish_reason["type"] if isinstance(res.finish_reason, dict) else None,
                        "stop_reason": None,
                        "token_ids": list(res.output_ids),
                        "logprobs": None if content is None else {"content": content},
                        "weight_versions": [{"version": version, "start": 0, "end": n}] if n else [],
                    }
                ],
                "prompt_token_ids": None,
                "kv_transfer_params": reply_kv,
                "output_mode": "tokens",
            }

        # ---- dev routes -------------------------------------------------------------------------
        async def sleep(self, request):
            level = int(request.query.get("level", "1"))
            if not 0 <= level <= 2:
                return error("level: Input should be less than or equal to 2", 422)
            if not cli.enable_sleep_mode:
                return error("Sleep mode is not enabled (start the server with --enable-sleep-mode)", 500, "Internal")
            self.scheduler.abort(abort_all=True)
            self.sleeping = {"weights", "kv_cache"}
            await self.scheduler.run_exclusive(self.control.release_tags, ["weights", "kv_cache", "cuda_graph"])
            return web.json_response({"status": "sleeping", "level": level})

        async def wake_up(self, request):
            tags = request.query.getall("tags", []) or ["weights", "kv_cache"]
            unknown = [t for t in tags if t not in ("weights", "kv_cache")]
            if unknown:
                return error(f"unknown sleep tags {unknown}", 500, "InternalServerError")
            self.sleeping.difference_update(tags)
            hf_tags = [*tags, "cuda_graph"] if "kv_cache" in tags else tags
            await self.scheduler.run_exclusive(self.control.resume_tags, hf_tags)
            return web.json_response({"status": "sleeping" if self.sleeping else "awake", "tags": tags})

        async def reset_prefix_cache(self, request):
            if self.scheduler.is_busy:
                return web.json_response({"success": False})
            await self.scheduler.run_exclusive(self.control.flush_now)
            return web.json_response({"success": True})

        async def collective_rpc(self, request):
            body = await request.json()
            if body.get("method") is None:
                return error("Missing 'method' in request body", 400)
            if body["method"] != "reload_weights":
                return error(f"'Worker' object has no attribute '{body['method']}'", 500, "InternalServerError")
            path = (body.get("kwargs") or {}).get("weights_path")
            if "weights" in self.sleeping:
                return error("weights are asleep: wake_up(tags=['weights']) before reloading", 500, "Internal")
            if not path or not os.path.isdir(path):
                return error(f"weights_path {path!r} is not a directory", 500, "InternalServerError")
            tensors = read_safetensors_dir(path)
            await self.scheduler.run_exclusive(load_weights_strict, self.model, tensors)
            return web.json_response({"results": [None] * self._world()})

        async def pause(self, request):
            mode = request.query.get("mode", "abort")
            if mode not in ("abort", "wait", "keep"):
                return error(f"mode: Input should be 'abort', 'wait' or 'keep', got {mode!r}", 422)
            await self.scheduler.pause(mode="abort" if mode == "abort" else "in_place")
            self.paused = mode
            return web.json_response({"status": "paused"})

        async def resume(self, request):
            self.paused = ""
            self.scheduler.resume()
            return web.json_response({"status": "resumed"})

        async def abort_requests(self, request):
            ids = (await request.json()).get("request_ids")
            n = self.scheduler.abort(abort_all=True) if not ids else sum(self.scheduler.abort(rid=i) for i in ids)
            return web.json_response({"status": "aborted", "aborted": n})

        def _world(self) -> int:
            return (cli.tensor_parallel_size or 1) * (cli.pipeline_parallel_size or 1) * (cli.data_parallel_size or 1)

        async def world_size(self, request):
            include_dp = request.query.get("include_dp", "true").lower() != "false"
            tp_pp = (cli.tensor_parallel_size or 1) * (cli.pipeline_parallel_size or 1)
            return web.json_response({"world_size": self._world() if include_dp else tp_pp})

        async def server_info(self, request):
            config = {
                "model_config": {
                    "model": cli.model,
                    "dtype": f"torch.{self.dtype}",
                    "max_model_len": cli.max_model_len,
                },
                "parallel_config": {
                    "tensor_parallel_size": cli.tensor_parallel_size or 1,
                    "pipeline_parallel_size": cli.pipeline_parallel_size or 1,
                    "data_parallel_size": cli.data_parallel_size or 1,
                    "distributed_executor_backend": cli.distributed_executor_backend,
                },
                "cache_config": {"gpu_memory_utilization": cli.gpu_memory_utilization, "enable_prefix_caching": True},
                "model_config_seed": cli.seed,
                "weight_transfer_config": cli.weight_transfer_config,
                "kv_transfer_config": cli.kv_transfer_config,
            }
            if request.query.get("config_format", "text") == "text":
                config = str(config)
            env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
            return web.json_response({"vllm_config": config, "vllm_env": env, "system_env": {}, "fake_cli": vars(cli)})

        @web.middleware
        async def log_requests(self, request, handler):
            if request.path not in _QUIET:
                try:
                    body = await request.json() if request.body_exists else None
                except ValueError:
                    body = "<not JSON>"
                if isinstance(body, dict) and isinstance(body.get("update_info"), dict):
                    body = {"update_info": {k: v for k, v in body["update_info"].items() if k != "ipc_handles_pickled"}}
                line = {"method": request.method, "path": request.path, "query": request.query_string, "body": body}
                print(f"{REQUEST_MARK} {json.dumps(line)}", file=sys.stderr, flush=True)
            return await handler(request)

    return FakeVLLMServer()


async def serve(cli: argparse.Namespace) -> None:
    from aiohttp import web

    from slime.engine.hf import server as hf_server
    from slime.engine.hf.http_util import errors_as_json

    server = make_server(cli)
    app = web.Application(client_max_size=1 << 30, middlewares=[server.log_requests, errors_as_json])
    await hf_server.run_app(server, app)


def main(argv: list[str] | None = None) -> None:
    cli = build_parser().parse_args(argv)
    if not cli.model or cli.port is None:
        sys.exit("fake_vllm: --model and --port are required")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s [fake-vllm] %(message)s")
    logger.info("args %s", json.dumps({k: v for k, v in vars(cli).items() if v is not None}))
    import torch

    torch.set_num_threads(1)
    asyncio.run(serve(cli))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
