"""`remote_rm`: a reward model behind HTTP (docs/data-and-rewards.md#rewards).

POST `{prompt, response, label}` as JSON to `rollout.rm_url`; the JSON answer is the reward (a number, or a
dict picked by `rollout.reward_key`). One pooled aiohttp session serves every request of the run: it
lives on its own event-loop thread, so callers on any loop (each rollout step runs its own) share the
pool. Connection errors, timeouts and 5xx are retried with backoff min(2^attempt, 30) s + jitter;
a 4xx or a non-JSON answer is an error at once (retrying a bad request only repeats it).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from typing import Any

import aiohttp

from slime.types import Sample


class RemoteRewardModel:
    """A pooled client of one reward-model URL; `await score(sample)` from any event loop."""

    def __init__(self, url: str, *, timeout_s: float, max_retries: int, max_connections: int, backoff_s: float = 1.0):
        self.url = url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.backoff_s = backoff_s  # the unit of the backoff (tests shorten it)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-rm", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        # counted on the client's loop thread, read by take_counts: retried attempts (a 5xx, a timeout, a refused
        # connection), and requests that failed after every retry
        self._counts = {"retries": 0, "gave_up": 0}

    async def score(self, sample: Sample) -> Any:
        """The reward model's JSON answer for `sample`."""
        payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
        future = asyncio.run_coroutine_threadsafe(self._post(payload), self._loop)
        return await asyncio.wrap_future(future)

    async def _post(self, payload: dict[str, Any]) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        error = ""
        for attempt in range(self.max_retries + 1):
            try:
                async with self._session.post(self.url, json=payload) as resp:
                    body = await resp.text()
                    if resp.status < 400:
                        try:
                            return json.loads(body)
                        except json.JSONDecodeError:
                            raise RuntimeError(f"POST {self.url} -> {resp.status}: not JSON: {body[:200]!r}") from None
                    if resp.status < 500:
                        raise RuntimeError(f"POST {self.url} -> {resp.status}: {body[:500]}")
                    error = f"{resp.status}: {body[:200]}"
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                error = repr(exc)
            if attempt < self.max_retries:
                self._counts["retries"] += 1
                await asyncio.sleep(min(self.backoff_s * 2**attempt, 30.0) + random.uniform(0, self.backoff_s))
        self._counts["gave_up"] += 1
        raise RuntimeError(f"POST {self.url} failed {self.max_retries + 1} times; last error {error}")

    def take_counts(self) -> dict[str, int]:
        """{"retries": n, "gave_up": m} since the last call (zeroed on the client's loop thread)."""

        async def take() -> dict[str, int]:
            counts, self._counts = self._counts, {"retries": 0, "gave_up": 0}
            return counts

        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout=10)

    def close(self) -> None:
        """Close the session and stop the loop thread."""
        if not self._thread.is_alive():
            return
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
