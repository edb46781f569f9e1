"""A server that answers every request with one permissive JSON body and records `(method, path, query, body)`:
what the contract tests point a client at to see exactly which requests it sends (SGLang's probe judges them)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any, Optional

from aiohttp import web

from slime.engine.process import free_port, http_url

# Enough of every SGLang answer the clients read: success flags, loads, the weight version, tp size, checks.
ANSWER = {"success": True, "message": "ok", "loads": [], "weight_version": "1", "tp_size": 1, "ranks": []}


class RequestRecorder:
    """Serves on 127.0.0.1 from a thread of its own; `requests` in arrival order. `answers` may give a path its
    own answer: a function of the requests so far returning the JSON body."""

    def __init__(self, answers: Optional[dict[str, Callable[[list], Any]]] = None):
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.answers = dict(answers or {})
        self.url = ""
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None

    def start(self) -> RequestRecorder:
        port = free_port("127.0.0.1")
        self.url = http_url("127.0.0.1", port)
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(port, ready), daemon=True, name="request-recorder").start()
        if not ready.wait(30):
            raise RuntimeError(f"request recorder did not start on port {port}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self, port: int, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._answer)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", port).start())
        ready.set()
        self._loop.run_forever()

    async def _answer(self, request: web.Request) -> web.Response:
        text = await request.text() if request.body_exists else ""
        body = json.loads(text) if text else None
        self.requests.append((request.method, request.path, dict(request.query), body))
        answer = self.answers.get(request.path)
        return web.json_response(ANSWER if answer is None else answer(self.requests))
