"""The hf engine's control routes, with SGLang 0.5.23's rules (docs/architecture.md#engine-routes).

  GET  /health, /health_generate       `sglang/srt/entrypoints/http_server.py:health_generate`: a one-token
                                       generation joins the queue; 200 as soon as any token is sampled after
                                       the probe arrived, 503 after SGLANG_HEALTH_CHECK_TIMEOUT seconds
                                       (default 20) without one, so it waits while generation is paused.
                                       `/health` answers 200 at once when SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
                                       is false. Released memory: 503 (SGLang would generate on it).
  GET|POST /flush_cache                200 when no batch is running, else 400 (callers retry)
  POST /pause_generation {mode?}       "abort" (default, as SGLang): abort in-flight, hold new ones;
                                       "in_place": hold the running batch between two decode steps too
                                       (`Scheduler.pause`)
  POST /continue_generation
  POST /abort_request {rid | abort_all}
  POST /release_memory_occupation {tags?}, /resume_memory_occupation {tags?}
                                       `scheduler_components/weight_updater.py`: release needs an idle engine
                                       (waiting requests allowed while paused), resume only of released tags;
                                       SGLang's scheduler dies on either (an assertion, a KeyError), this engine
                                       answers 400 (`ControlRuleError`)

Tags are SGLang's GPU_MEMORY_TYPE_* names. On CUDA, releasing "weights" moves them to host memory;
elsewhere tags are only tracked.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from typing import Any

import torch
from aiohttp import web

from slime.engine.hf.generator import GenerationError, GenerationRequest
from slime.engine.hf.http_util import json_body
from slime.engine.hf.sampling import SamplingParams

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"  # seconds; SGLang's default 20
HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"  # SGLang's default true


class ControlRuleError(GenerationError):
    """A control call SGLang's scheduler refuses by dying; this engine answers it with HTTP 400."""


def health_timeout_s() -> float:
    """Seconds, read as `http_server.py` reads it (an integer)."""
    return float(int(os.environ.get(HEALTH_TIMEOUT_ENV, "20")))


def health_generates() -> bool:
    return os.environ.get(HEALTH_GENERATION_ENV, "true").strip().lower() not in ("0", "false", "no", "off")


def parse_tags(tags: Any) -> list[str]:
    """`tags` of a release/resume body: None means every tag."""
    if tags is None:
        return list(MEMORY_TAGS)
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list):
        raise GenerationError(f"tags must be a list of strings, got {tags!r}")
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise GenerationError(f"unknown memory tags {unknown}; valid: {list(MEMORY_TAGS)}")
    return list(tags)


def empty_device_cache(device: str, *, collect: bool) -> None:
    """Return cached CUDA blocks to the driver; `collect` first frees unreachable tensors (a full
    `gc.collect()` takes 0.2-0.3 s with torch and transformers loaded, so only memory release does it)."""
    if collect:
        gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


class EngineControl:
    """The control handlers over one engine's model, generator and scheduler."""

    def __init__(self, *, model, generator, scheduler, device: str):
        self.model = model
        self.generator = generator
        self.scheduler = scheduler
        self.device = device

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/health_generate", self.health),
            web.get("/flush_cache", self.flush_cache),
            web.post("/flush_cache", self.flush_cache),
            web.post("/pause_generation", self.pause_generation),
            web.post("/continue_generation", self.continue_generation),
            web.post("/abort_request", self.abort_request),
            web.post("/release_memory_occupation", self.release_memory),
            web.post("/resume_memory_occupation", self.resume_memory),
        ]

    # ---------------------------------------------------------------- health
    async def health(self, request: web.Request) -> web.Response:
        if request.path == "/health" and not health_generates():
            return web.Response(text="")
        if self.scheduler.released_tags:
            return web.Response(status=503, text=f"memory released: {sorted(self.scheduler.released_tags)}")
        return web.Response(status=200 if await self._probe_generates() else 503, text="")

    async def _probe_generates(self) -> bool:
        """Whether a token is sampled (the probe's or any other request's) within the health timeout."""
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        before = self.generator.num_generated_tokens
        probe = GenerationRequest([self.generator.pad_token_id], SamplingParams(max_new_tokens=1, temperature=0.0), rid)
        task = asyncio.ensure_future(self.scheduler.submit([probe]))
        deadline = time.monotonic() + health_timeout_s()
        healthy = False
        while time.monotonic() < deadline:
            await asyncio.wait({task}, timeout=0.05)
            if self.generator.num_generated_tokens > before or (task.done() and task.exception() is None):
                healthy = True
                break
            if task.done():  # the probe failed
                break
        if not task.done():
            self.scheduler.abort(rid=rid)
            await asyncio.wait({task}, timeout=5)
        return healthy

    # ---------------------------------------------------------------- generation control
    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.scheduler.is_busy:
            return web.Response(status=400, text="Cache not flushed: there are running requests.")
        await self.scheduler.run_exclusive(self.flush_now)
        return web.Response(text="Cache flushed.")

    def flush_now(self) -> None:
        """Empty the prefix cache (on the model thread)."""
        self.generator.flush_cache()
        empty_device_cache(self.device, collect=False)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        await self.scheduler.pause(mode=str(body.get("mode") or "abort"))
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.scheduler.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        n = self.scheduler.abort(rid=body.get("rid"), abort_all=bool(body.get("abort_all", False)))
        return web.json_response({"num_aborted": n})

    # ---------------------------------------------------------------- memory
    async def release_memory(self, request: web.Request) -> web.Response:
        tags = parse_tags((await json_body(request)).get("tags"))
        if not self.scheduler.is_fully_idle(ignore_waiting=self.scheduler.paused):
            raise ControlRuleError("release_memory_occupation should be called only when server is idle.")
        await self.scheduler.run_exclusive(self.release_tags, tags)
        return web.json_response({"success": True, "released_tags": sorted(self.scheduler.released_tags)})

    async def resume_memory(self, request: web.Request) -> web.Response:
        tags = parse_tags((await json_body(request)).get("tags"))
        not_released = [t for t in tags if t not in self.scheduler.released_tags]
        if not_released:
            raise ControlRuleError(f"resume_memory_occupation of tags that are not released: {not_released}")
        await self.scheduler.run_exclusive(self.resume_tags, tags)
        return web.json_response({"success": True, "released_tags": sorted(self.scheduler.released_tags)})

    def release_tags(self, tags: list[str]) -> None:
        """Release `tags` (on the model thread)."""
        if "weights" in tags and "weights" not in self.scheduler.released_tags and self.device.startswith("cuda"):
            self.model.to("cpu")
        self.scheduler.released_tags.update(tags)
        self.generator.flush_cache()
        empty_device_cache(self.device, collect=True)

    def resume_tags(self, tags: list[str]) -> None:
        """Take `tags` back (on the model thread)."""
        if "weights" in tags and "weights" in self.scheduler.released_tags and self.device.startswith("cuda"):
            self.model.to(self.device)
        self.scheduler.released_tags.difference_update(tags)
