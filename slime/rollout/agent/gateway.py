"""The OpenAI-compatible gateway: an HTTP server on its own thread and event loop, in the rollout manager's
process, in front of the policy's router.

Each episode opens a session and gets its own base URL, `http://HOST:PORT/sessions/<id>/v1` (or the gateway's
`/v1` with the header `X-Session-Id: <id>`), and the gateway's API key. Routes under a session:

    POST {base}/chat/completions    messages (+ tools), stream or not, logprobs
    POST {base}/completions         prompt text or token ids, stream or not, logprobs
    GET  {base}/models              the one model served ("policy")

A request without a session is refused (400) saying where to send it; an unknown or ended session gets 404; a
wrong API key 401. Errors have OpenAI's shape (`{"error": {"message", "type", "code"}}`), so the `openai` client
raises them with the message. A session's turns run one at a time; the engine call itself runs on the event loop
of the rollout that opened the session (its HTTP session, its abort).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from slime.net import free_port
from slime.rollout.agent.openai_api import (
    RequestError,
    chat_response,
    completion_response,
    parse_request,
    stream_chunks,
)
from slime.rollout.agent.session import EngineCall, EpisodeSession

SESSION_HEADER = "X-Session-Id"


class _Open:
    """A session the gateway serves: the episode, how its turns reach the engine, one turn at a time."""

    def __init__(self, episode: EpisodeSession, engine: EngineCall):
        self.episode, self.engine, self.lock = episode, engine, asyncio.Lock()


class AgentGateway:
    """Start with `start()`; `open()` a session per episode, `close()` it when the episode ends; `shutdown()`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None):
        self.host, self.port = host, port
        self.api_key = f"slime-{secrets.token_hex(16)}"
        self._sessions: dict[str, _Open] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> str:
        """Serve on `host:port` (a free port when none was given); returns the gateway's URL once it listens."""
        self.port = self.port or free_port(self.host)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-gateway", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        return self.url

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024**2)
        for prefix in ("/sessions/{session}/v1", "/v1"):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_post(prefix + "/completions", self._completion)
            app.router.add_get(prefix + "/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def shutdown(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop = self._thread = self._runner = None

    # ---- sessions (called from the rollout's event loop) ----------------------------------------------------
    def open(self, episode: EpisodeSession, engine: EngineCall) -> tuple[str, str]:
        """Serve `episode`; `engine(sample, params)` samples a turn. Returns (session id, its base URL)."""
        session_id = uuid.uuid4().hex
        self._sessions[session_id] = _Open(episode, engine)
        return session_id, f"{self.url}/sessions/{session_id}/v1"

    def close(self, session_id: str) -> EpisodeSession:
        """End the session: later requests get 404. Returns its episode."""
        return self._sessions.pop(session_id).episode

    # ---- routes --------------------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._turn(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._turn(request, "completion")

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._session(request)
        except RequestError as exc:
            return _error(exc)
        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "slime"}]})

    async def _turn(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            open_ = self._session(request)
            try:
                body = await request.json()
            except json.JSONDecodeError as exc:
                raise RequestError(f"the request body is not JSON: {exc}") from exc
            turn = parse_request(body, kind, open_.episode.sampling_params)
            async with open_.lock:
                result = await open_.episode.turn(turn, open_.engine)
        except RequestError as exc:
            return _error(exc)
        if turn.stream:
            return await _stream(request, stream_chunks(turn, result))
        respond = chat_response if kind == "chat" else completion_response
        return web.json_response(respond(turn, result))

    def _session(self, request: web.Request) -> _Open:
        """The request's open session; RequestError (401, 400, 404) otherwise."""
        if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
            raise RequestError("invalid API key: use the api_key the episode's entrypoint was given", status=401)
        session_id = request.match_info.get("session") or request.headers.get(SESSION_HEADER)
        if not session_id:
            raise RequestError(
                "no session: this gateway serves training episodes only; send requests to the base_url the "
                f"episode's entrypoint was given (.../sessions/<id>/v1), or set the {SESSION_HEADER} header"
            )
        if session_id not in self._sessions:
            raise RequestError(f"session {session_id} is not open: its episode has ended, or it never began", 404)
        return self._sessions[session_id]


def _error(exc: RequestError) -> web.Response:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return web.json_response({"error": {"message": str(exc), "type": kind, "code": exc.status}}, status=exc.status)


async def _stream(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    """Server-sent events: one `data:` line per chunk, then `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a coroutine function) run on `loop` from another event loop's thread, awaited there."""

    async def call(*args: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), loop))

    return call
