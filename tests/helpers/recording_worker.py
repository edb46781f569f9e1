"""A stand-in SGLang worker that records what reaches it: the thing behind a real router in router contract tests.

`RecordingWorker(model_path).start()` serves, on a thread of its own, what sglang-router 0.3.2 asks of a
worker when it registers one (docs/architecture.md#router: GET /health, /server_info, /model_info, then a tokenizer
load from the reported `model_path`, so give it a real model directory) and `POST /generate`, answered in
SGLang's shape (one sampled token), or with 503 while `failing` is set. Every request is recorded as
`(method, path, body)` in arrival order.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from tests.helpers.threaded_server import ThreadedServer


class RecordingWorker(ThreadedServer):
    """One recording worker on 127.0.0.1; `requests` lists `(method, path, body)` as they arrived."""

    def __init__(self, model_path: str):
        super().__init__()
        self.model_path = model_path
        self.requests: list[tuple[str, str, Any]] = []
        self.failing = False  # answer /generate with 503 (an engine that is unhealthy for a while)

    def start(self) -> RecordingWorker:
        return super().start()

    def bodies(self, path: str) -> list[Any]:
        return [body for _, p, body in list(self.requests) if p == path]

    def wait_for(self, path: str, count: int = 1, timeout_s: float = 30.0) -> list[Any]:
        """The bodies of requests to `path` once at least `count` arrived (TimeoutError after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while len(found := self.bodies(path)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} requests to {path} expected, {len(found)} came: {self.requests}")
            time.sleep(0.02)
        return found

    # ---- the server ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_route("GET", "/health", self._ok)
        for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            app.router.add_route("GET", path, self._info)
        app.router.add_route("POST", "/generate", self._generate)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler) -> web.StreamResponse:
        body = None
        if request.body_exists:
            text = await request.text()
            body = json.loads(text) if text else None
        self.requests.append((request.method, request.path, body))
        return await handler(request)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _info(self, request: web.Request) -> web.Response:
        # the fields sglang-router reads of /server_info and /model_info (worker metadata, tokenizer path)
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "served_model_name": self.model_path,
                "is_generation": True,
                "tp_size": 1,
                "dp_size": 1,
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
            }
        )

    async def _generate(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"error": "failing on purpose"}, status=503)
        return web.json_response(
            {
                "text": "a",
                "output_ids": [64],
                "meta_info": {
                    "id": "recorded",
                    "finish_reason": {"type": "length", "length": 1},
                    "prompt_tokens": 3,
                    "completion_tokens": 1,
                    "cached_tokens": 0,
                    "weight_version": "default",
                    "output_token_logprobs": [[-0.5, 64, None]],
                },
            }
        )
