"""An aiohttp app served on 127.0.0.1 from a thread of its own: the base of the tests' recording servers."""

from __future__ import annotations

import asyncio
import threading
from typing import Optional

from aiohttp import web

from slime.engine.process import http_url
from slime.net import free_port


class ThreadedServer:
    """`start()` serves `app()` on a free port of 127.0.0.1 (its address in `url`); `stop()` ends it."""

    def __init__(self):
        self.url = ""
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None

    def app(self) -> web.Application:
        raise NotImplementedError

    def start(self):
        port = free_port("127.0.0.1")
        self.url = http_url("127.0.0.1", port)
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(port, ready), daemon=True, name=type(self).__name__).start()
        if not ready.wait(30):
            raise RuntimeError(f"{type(self).__name__} did not start on port {port}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self, port: int, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self.app())
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", port).start())
        ready.set()
        self._loop.run_forever()
