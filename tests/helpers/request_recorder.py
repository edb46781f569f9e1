"""A server that answers every request with one permissive JSON body and records `(method, path, query, body)`:
what the contract tests point a client at to see exactly which requests it sends (SGLang's probe judges them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Optional

from aiohttp import web

from tests.helpers.threaded_server import ThreadedServer

# Enough of every SGLang answer the clients read: success flags, loads, the weight version, tp size, checks.
ANSWER = {"success": True, "message": "ok", "loads": [], "weight_version": "1", "tp_size": 1, "ranks": []}


class RequestRecorder(ThreadedServer):
    """Serves on 127.0.0.1 from a thread of its own; `requests` in arrival order. `answers` may give a path its
    own answer: a function of the requests so far returning the JSON body."""

    def __init__(self, answers: Optional[dict[str, Callable[[list], Any]]] = None):
        super().__init__()
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.answers = dict(answers or {})

    def start(self) -> RequestRecorder:
        return super().start()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        text = await request.text() if request.body_exists else ""
        body = json.loads(text) if text else None
        self.requests.append((request.method, request.path, dict(request.query), body))
        answer = self.answers.get(request.path)
        return web.json_response(ANSWER if answer is None else answer(self.requests))
