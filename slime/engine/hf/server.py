"""The built-in engine server: a transformers model behind SGLang 0.5.23's HTTP contract
(docs/architecture.md#http-contracts).

Run: `python -m slime.engine.hf.server --model-path P --host 127.0.0.1 --port PORT ...` (the engine
launcher reserves PORT, as it does for SGLang). Logs go to stderr; SIGTERM/SIGINT exit cleanly (status 0).

Endpoints (SGLang's names, payloads and rules; errors are `{"error": {"message": ...}}` with HTTP 400):
  POST /generate                       single or batch (`protocol.py`); unknown top-level keys are
                                       ignored, unknown `sampling_params` keys are a 400 naming the key
  GET  /server_info, /get_server_info  launch arguments and state
  GET  /model_info, /get_model_info    model_path, architectures, weight_version, ...
  GET  /v1/loads                       request counts and memory; shape documented on `HFServer.v1_loads`
  POST /update_weights_from_disk {model_path, weight_version?, load_format?, abort_all_requests?, flush_cache?}
                                       flush_cache (default true) fails the call, weights loaded, while an
                                       in-place pause holds requests, as SGLang's does; a directory without
                                       config.json may hold some of the weights (`_load_from_disk`)
  health, flush, pause/continue, abort, memory release/resume: `control.py`
  weight-update sessions, tensor and distributed syncs, /weights_checker: `weight_receiver.py`
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from transformers import AutoTokenizer

from slime.engine.hf import batch_invariant
from slime.engine.hf.control import EngineControl
from slime.engine.hf.generator import GenerationError, Generator
from slime.engine.hf.http_util import DropMalformedRequestErrors, errors_as_json, json_body
from slime.engine.hf.lora_routes import LoRARoutes
from slime.engine.hf.lora_slot import LoRASlot
from slime.engine.hf.prefix_cache import DEFAULT_MAX_TOKENS
from slime.engine.hf.protocol import generate_response, parse_generate
from slime.engine.hf.scheduler import Scheduler
from slime.engine.hf.vision import EngineVision
from slime.engine.hf.weight_receiver import WeightReceiver
from slime.engine.hf.weights import WeightLoadError, load_weights_strict, read_safetensors_dir
from slime.models.hf_model import auto_model_class

logger = logging.getLogger("slime.engine.hf.server")

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def load_model(model_path: str, device: str, dtype: str):
    """(model, tokenizer) from an HF dir; dtype auto = bf16 on cuda, fp32 on cpu."""
    name = _DTYPES.get(dtype) or ("bfloat16" if device.startswith("cuda") else "float32")
    model = auto_model_class(model_path).from_pretrained(model_path, dtype=getattr(torch, name))
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(model_path)


def decoding_mode(args: argparse.Namespace, model) -> tuple[bool, int]:
    """(batch-invariant forward passes, max batch size) of a server: with --enable-deterministic-inference and
    batches of more than one request, batch-invariant batching where `batch_invariant.unsupported` allows it, else
    each request decoded alone (as deterministic as that, only slower: said in the log)."""
    if not args.enable_deterministic_inference or args.max_batch_size <= 1:
        return False, args.max_batch_size
    reason = batch_invariant.unsupported(model)
    if reason is None:
        return True, args.max_batch_size
    logger.warning("deterministic inference decodes each request alone: %s", reason)
    return False, 1


class HFServer:
    """Holds the model, generator and scheduler, and implements the HTTP handlers."""

    lora_routes_class = LoRARoutes  # the LoRA routes' handlers (a server with SGLang's deserialiser subclasses them)

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.model, self.tokenizer = load_model(args.model_path, args.device, args.dtype)
        self.lora = (
            LoRASlot(self.model, max_rank=args.max_lora_rank, target_modules=args.lora_target_modules)
            if args.enable_lora
            else None
        )
        self.dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.batch_invariant, self.max_batch_size = decoding_mode(args, self.model)
        self.generator = Generator(
            self.model,
            self.tokenizer,
            seed=args.seed,
            context_length=args.context_length,
            prefix_cache_tokens=args.prefix_cache_tokens,
            capture_routes=args.enable_return_routed_experts,
            batch_invariant=self.batch_invariant,
            vision=EngineVision.of_checkpoint(self.model, args.model_path),
            # a LoRA slot switches its adapter on and off between batches, which a captured graph would not see
            cuda_graphs=not (args.disable_cuda_graph or args.enable_lora),
        )
        self.scheduler = Scheduler(
            self.generator,
            max_batch_size=self.max_batch_size,
            batch_wait_s=args.batch_wait_ms / 1000.0,
            weight_version=args.weight_version,
            lora=self.lora,
        )
        self.port: int | None = None
        self.receiver = WeightReceiver(self.model, self.scheduler, device=args.device, lora=self.lora)
        self.control = EngineControl(
            model=self.model, generator=self.generator, scheduler=self.scheduler, device=args.device
        )

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/generate", self.generate),
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.get("/model_info", self.model_info),
            web.get("/get_model_info", self.model_info),
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.get("/v1/loads", self.v1_loads),
            *self.control.routes(),
            *self.receiver.routes(),
            *self.lora_routes_class(self.lora, self.scheduler).routes(),
        ]

    # ---------------------------------------------------------------- generation
    async def generate(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        body = await json_body(request)
        logger.debug("POST /generate %s", body)
        call = parse_generate(body, self.tokenizer.encode)  # ValueError → 400 (middleware)
        completions = await self.scheduler.submit(call.requests)
        decode_token = lambda tid: self.generator.decode([tid], skip_special_tokens=False)  # noqa: E731
        return web.json_response(generate_response(call, completions, decode_token, arrived))

    # ---------------------------------------------------------------- info
    async def server_info(self, request: web.Request) -> web.Response:
        a = self.args
        return web.json_response(
            {
                "engine": "hf",
                "version": "slime-hf-engine",
                "model_path": a.model_path,
                "tokenizer_path": a.model_path,
                "served_model_name": a.model_path,
                "host": a.host,
                "port": self.port,
                "seed": a.seed,
                "random_seed": a.seed,
                "device": a.device,
                "dtype": self.dtype,
                "max_batch_size": self.max_batch_size,
                "enable_deterministic_inference": a.enable_deterministic_inference,
                "batch_invariant": self.batch_invariant,
                "batch_wait_ms": a.batch_wait_ms,
                "num_threads": a.num_threads,
                "prefix_cache_tokens": a.prefix_cache_tokens,
                "disable_radix_cache": a.prefix_cache_tokens == 0,
                "context_length": self.generator.context_length,
                "tp_size": 1,
                "dp_size": 1,
                "weight_version": self.scheduler.weight_version,
                "device_memory_allocated_bytes": _device_memory_allocated(self.args.device),
                "internal_states": [
                    {
                        "paused": self.scheduler.paused,
                        "released_tags": sorted(self.scheduler.released_tags),
                        "num_finished_reqs": self.scheduler.num_finished,
                        "num_generated_tokens": self.generator.num_generated_tokens,
                        **self.scheduler.loads(),
                        **self.generator.prefix_cache.stats(),
                    }
                ],
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.model.config
        return web.json_response(
            {
                "model_path": self.args.model_path,
                "tokenizer_path": self.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.scheduler.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": getattr(config, "model_type", None),
                "architectures": list(getattr(config, "architectures", None) or []),
            }
        )

    async def v1_loads(self, request: web.Request) -> web.Response:
        """`{"loads": [{"dp_rank": 0, "num_running_reqs", "num_waiting_reqs", "num_total_reqs", "memory"?}]}`:
        one entry per data-parallel rank (always one here); waiting includes requests held by a pause. `memory`
        (`memory_gib`) when `include` asks for it or is absent, as SGLang's `LoadSnapshot.to_dict` adds its section
        (`sglang/srt/managers/load_snapshot.py`); asking for it starts a new peak."""
        entry = {"dp_rank": 0, **self.scheduler.loads()}
        include = request.query.get("include")
        if include is None or {"memory", "all"} & set(include.split(",")):
            entry["memory"] = memory_gib(self.model, self.args.device)
        return web.json_response({"loads": [entry]})

    # ---------------------------------------------------------------- weights from disk
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
            model_path = body.get("model_path")
            if not model_path:
                raise WeightLoadError("model_path is required")
            if body.get("load_format") not in (None, "auto", "safetensors"):
                raise WeightLoadError(f"load_format={body['load_format']!r} is not supported (auto | safetensors)")
            if body.get("abort_all_requests"):
                self.scheduler.abort(abort_all=True)
            version = body.get("weight_version")
            count = await self.scheduler.run_exclusive(self._load_from_disk, str(model_path), version)
            if body.get("flush_cache", True) and self.scheduler.is_busy:
                # SGLang 0.5.23 `weight_updater.py: flush_cache_after_weight_update`: loaded, but its cache cannot be
                # flushed under held requests, and the call reports failure
                raise WeightLoadError(
                    "Weights were updated, but the cache was not flushed because requests are still running or "
                    "queued. Retract or finish them, then call /flush_cache."
                )
        except (WeightLoadError, GenerationError) as exc:
            logger.warning("update_weights_from_disk failed: %s", exc)
            return web.json_response({"success": False, "message": str(exc), "num_paused_requests": 0}, status=400)
        message = f"Succeeded to update model weights ({count} tensors from {model_path})."
        logger.info("%s weight_version=%s", message, self.scheduler.weight_version)
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    def _load_from_disk(self, model_path: str, version: Any) -> int:
        """A checkpoint directory (config.json beside its safetensors) must hold every weight; a directory of named
        tensors alone (no config.json: an adapter sync's trained base weights) updates those, as SGLang's loader
        loads whatever names a directory holds (`model_loader/loader.py:DefaultModelLoader._prepare_weights`, then
        the model's `load_weights`). Either way no name or shape may be foreign to the model."""
        tensors = read_safetensors_dir(model_path)
        partial = not (Path(model_path) / "config.json").exists()
        self.generator.flush_cache()  # SGLang flushes its radix cache on every weight update
        count = load_weights_strict(self.model, tensors, partial=partial, layout=self.receiver.layout)
        if version is not None:
            self.scheduler.weight_version = str(version)
        return count


def memory_gib(model: torch.nn.Module, device: str) -> dict[str, float]:
    """The engine's memory, GiB, in SGLang's `MemoryMetrics` names where they mean the same: `weight_gb`, the bytes of
    the model's parameters and buffers on the engine's device (0 while the weights tag is released to the host). On
    CUDA also `peak_gb`: the most torch's allocator held since the last call (weights plus what generation built
    beside them: this engine keeps no KV pool, its cache grows with each batch); each call starts a new peak."""
    kind = torch.device(device).type
    tensors = [*model.parameters(), *model.buffers()]
    report = {"weight_gb": sum(t.nbytes for t in tensors if t.device.type == kind) / 2**30}
    if kind == "cuda" and torch.cuda.is_available():
        report["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    return report


def _device_memory_allocated(device: str) -> int:
    """Bytes held by torch's CUDA allocator on the current device (0 on CPU)."""
    return int(torch.cuda.memory_allocated()) if device.startswith("cuda") and torch.cuda.is_available() else 0


async def serve(args: argparse.Namespace) -> None:
    server = HFServer(args)
    await run_app(server, web.Application(client_max_size=1 << 30, middlewares=[errors_as_json]))


async def run_app(server: HFServer, app: web.Application) -> None:
    """Serve `server`'s routes on `app` at its host and port until SIGTERM/SIGINT."""
    args = server.args
    app.add_routes(server.routes())
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    server.port = int(runner.addresses[0][1])  # the real port when --port 0
    server.scheduler.start()
    logger.info(
        "hf engine serving %s on http://%s:%d (device=%s dtype=%s weight_version=%s max_batch_size=%d%s)",
        args.model_path,
        args.host,
        server.port,
        args.device,
        server.dtype,
        args.weight_version,
        server.max_batch_size,
        ", batch-invariant" if server.batch_invariant else "",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("shutting down")
    await server.scheduler.stop()
    server.receiver.close()
    await runner.cleanup()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="the HTTP port (0: an ephemeral one, for tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES])
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=256,
        help="sequences decoded together; 1: each output independent of concurrent requests",
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="batch-invariant forward passes and a seed per request: outputs independent of the batch (SGLang's flag)",
    )
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="ms to wait for more requests after the first")
    p.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--context-length", type=int, default=None, help="tokens; default max_position_embeddings")
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="prompt tokens of one-request prefills kept for reuse (0: no prefix cache)",
    )
    p.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="decode on the dynamic KV cache, no CUDA graphs (as SGLang's flag; rollout.hf.cuda_graphs=false)",
    )
    p.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="capture each token's MoE experts for requests with return_routed_experts (as SGLang's flag)",
    )
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (as SGLang's flag)")
    p.add_argument("--max-lora-rank", type=int, default=16, help="the largest adapter rank the slot holds")
    p.add_argument(
        "--lora-target-modules", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"], help="HF module names"
    )
    p.add_argument("--weight-version", default="0")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [hf-engine pid=%(process)d] %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.server").addFilter(DropMalformedRequestErrors())

    torch.set_num_threads(max(1, args.num_threads))
    asyncio.run(serve(args))
    logger.info("stopped")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the ~1 s interpreter teardown of torch/transformers; nothing is left to save


if __name__ == "__main__":
    main()
