"""The HF engine's batcher: an asyncio request queue feeding the generator's batches.

- `submit()` validates and enqueues requests and awaits their results; it never blocks on pause
  (paused requests simply stay queued until `resume()`).
- One worker task takes up to `max_batch_size` queued requests, waiting at most `batch_wait_s`
  after the first, and decodes them in a single-thread executor under `lock`.
- Continuous batching (`max_batch_size` > 1 and a `Generator.joinable` model): the batch runs one decode
  step per executor call; between steps, requests queued meanwhile join it (up to `max_batch_size` live
  rows) and every row that finished resolves at once. Otherwise (`max_batch_size` 1; MoE route capture) a batch
  is one `Generator.generate` call and resolves when its last row ends. With a batch-invariant generator
  (`--enable-deterministic-inference`) either way gives each request the outputs it gets alone.
- Every other operation that touches the model (weight loads, memory release/resume, adapter loads)
  goes through `run_exclusive()`: it waits until no batch runs (none lands mid-batch, so a running row
  keeps its weights), and while it waits no request joins or starts a batch, so it never starves. An
  in-place pause (`pause("in_place")`, SGLang's mode) instead holds a continuous batch between two decode steps:
  the operation runs then, and the held rows decode on after `resume()`, on the new weights with their old KV
  cache; each response says which version sampled which of its tokens (`meta_info.weight_versions`).
- With a LoRA slot (`lora_slot.py`), a batch holds requests of one adapter only (or none), and runs with the slot
  switched accordingly.
- Abort marks requests; queued ones resolve at once with finish_reason type "abort", running ones
  stop at the next decode step and return their partial output. While paused nothing joins.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

from slime.engine.hf.batch import RunningBatch
from slime.engine.hf.generator import GenerationError, GenerationRequest, GenerationResult, Generator
from slime.engine.hf.lora_slot import NOT_ENABLED, LoRASlot
from slime.engine.hf.request import VersionChange, version_spans

logger = logging.getLogger(__name__)


@dataclass
class Completion:
    """One finished request: the result, the weight version it ended under, its queueing delay (s), and which
    version sampled which output tokens (`request.version_spans`)."""

    result: GenerationResult
    weight_version: str
    queue_time_s: float = 0.0
    weight_versions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(eq=False)
class _Pending:
    req: GenerationRequest
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float = 0.0  # when its prefill began (perf_counter)
    version_changes: list[VersionChange] = field(default_factory=list)  # weight updates it was held across


class Scheduler:
    """Owns the queue, the pause state and the lock that serialises all model access.

    Args:
        generator: the model wrapper that runs one batch.
        max_batch_size: most sequences decoded together.
        batch_wait_s: how long (seconds) to wait for more requests after the first of a batch.
        weight_version: initial version string stamped on responses.
        lora: the engine's LoRA slot (None: started without --enable-lora).
        continuous: let queued requests join a running batch where that is safe (False: every batch runs
            until its last row ends, for comparisons).
    """

    def __init__(
        self,
        generator: Generator,
        *,
        max_batch_size: int,
        batch_wait_s: float,
        weight_version: str,
        lora: LoRASlot | None = None,
        continuous: bool = True,
    ):
        self.generator = generator
        self.max_batch_size = max(1, int(max_batch_size))
        self.batch_wait_s = max(0.0, float(batch_wait_s))
        self.lora = lora
        self.continuous = continuous and self.max_batch_size > 1 and generator.joinable
        self.lock = threading.Lock()
        self._batch: Optional[RunningBatch] = None  # the rows being decoded (continuous batching)
        self._weight_version = str(weight_version)
        self.paused = False
        self.released_tags: set[str] = set()
        self.num_finished = 0  # requests resolved with a result since start (any finish reason)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._queue: deque[_Pending] = deque()
        self._running: list[_Pending] = []
        self._exclusive_waiting = 0  # run_exclusive calls waiting for the running batch to end
        self._wakeup: Optional[asyncio.Event] = None
        self._model_free: Optional[asyncio.Event] = None  # set while no batch runs or the running one is held
        self._released: Optional[asyncio.Event] = None  # set while no in-place pause holds the running batch
        self._task: Optional[asyncio.Task] = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the worker task (call from the running event loop)."""
        self._wakeup = asyncio.Event()
        self._model_free = asyncio.Event()
        self._model_free.set()
        self._released = asyncio.Event()
        self._released.set()
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        """Abort everything, stop the worker and the executor (does not wait for a running step)."""
        self.abort(abort_all=True)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- requests
    async def submit(self, reqs: list[GenerationRequest]) -> list[Completion]:
        """Enqueue `reqs` and wait for all of them. Raises GenerationError (HTTP 400) for bad input."""
        for req in reqs:
            self.generator.validate(req)
            self._check_adapter(req)
        self._check_not_released()
        loop = asyncio.get_running_loop()
        pending = [_Pending(req, loop.create_future()) for req in reqs]
        self._queue.extend(pending)
        self._wakeup.set()
        return list(await asyncio.gather(*(p.future for p in pending)))

    def abort(self, *, rid: Any = None, abort_all: bool = False) -> int:
        """Mark matching queued/running requests aborted; resolve the queued ones now. Returns the count."""
        count = 0
        for p in list(self._queue) + self._running:
            if abort_all or (rid is not None and p.req.rid == rid):
                p.req.aborted = True
                count += 1
        if count:
            kept = deque()
            for p in self._queue:
                if p.req.aborted:
                    self._resolve_aborted(p)
                else:
                    kept.append(p)
            self._queue = kept
        return count

    async def pause(self, mode: str = "abort", drain_timeout_s: float = 60.0) -> None:
        """Stop starting batches and admitting rows. Mode "abort" (SGLang's default) also aborts everything
        queued or running and waits (at most `drain_timeout_s` seconds) until the running batch has returned.
        Mode "in_place" (SGLang's `PauseGenerationReqInput`: requests stay, and continue after
        continue_generation with their old KV cache) holds a continuously batched running batch between two
        decode steps, where weight loads and other exclusive operations may run; a one-call batch (batch size 1,
        route capture) runs to its end first, as "retract" lets every running row finish here."""
        self.paused = True
        if mode == "abort":
            self.abort(abort_all=True)
            deadline = time.monotonic() + drain_timeout_s
            while self._running and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        elif mode == "in_place" and self.continuous:
            self._released.clear()

    def resume(self) -> None:
        """Undo `pause()`: a held batch decodes on, queued requests (including those sent while paused) are
        served."""
        self.paused = False
        self._released.set()
        self._wakeup.set()

    @property
    def weight_version(self) -> str:
        """The version stamped on responses; setting a new one records, for each running row that has output
        tokens, that they came from the old one (SGLang's `Scheduler.record_weight_version_change`)."""
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: str) -> None:
        old, self._weight_version = self._weight_version, str(version)
        if old == self._weight_version or self._batch is None:
            return
        for row in self._batch.rows:
            if row.out_ids:
                row.key.version_changes.append(VersionChange(old, len(row.out_ids)))

    @property
    def is_busy(self) -> bool:
        """True while a batch is running (the state in which SGLang refuses to flush its cache)."""
        return bool(self._running)

    @property
    def _admitting(self) -> bool:
        """Whether queued requests may start a batch or join one: not while paused or while an exclusive
        operation waits for the model (it would wait for as long as new rows keep joining)."""
        return not self.paused and not self._exclusive_waiting

    def is_fully_idle(self, *, ignore_waiting: bool = False) -> bool:
        """No batch running and (unless `ignore_waiting`) nothing queued: SGLang's condition for releasing
        memory (`ignore_waiting` while paused, when queued requests cannot start)."""
        return not self._running and (ignore_waiting or not self._queue)

    def loads(self) -> dict[str, int]:
        """Request counts: running = in the batch being decoded; waiting = queued (incl. held by pause)."""
        running, waiting = len(self._running), len(self._queue)
        return {"num_running_reqs": running, "num_waiting_reqs": waiting, "num_total_reqs": running + waiting}

    # ---------------------------------------------------------------- exclusive model access
    async def run_exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the model thread under the generation lock, once the running batch (which takes no
        new rows meanwhile) has ended or an in-place pause holds it between two steps."""
        self._exclusive_waiting += 1
        try:
            if self._model_free is not None:
                await self._model_free.wait()
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._locked, fn, *args)
        finally:
            self._exclusive_waiting -= 1
            if self._wakeup is not None:
                self._wakeup.set()

    def _locked(self, fn, *args):
        with self.lock:
            return fn(*args)

    # ---------------------------------------------------------------- worker
    def _check_not_released(self) -> None:
        if self.released_tags:
            raise GenerationError(
                f"memory is released ({sorted(self.released_tags)}); call /resume_memory_occupation first"
            )

    def _check_adapter(self, req: GenerationRequest) -> None:
        if self.lora is not None:
            self.lora.check_request(req.lora)
        elif req.lora is not None:
            raise GenerationError(NOT_ENABLED)

    def _take_same_adapter(self, lora: str | None) -> _Pending | None:
        """The first queued request of adapter `lora`, removed from the queue (None if there is none)."""
        for p in self._queue:
            if p.req.lora == lora:
                self._queue.remove(p)
                return p
        return None

    def _resolve_aborted(self, p: _Pending) -> None:
        if not p.future.done():
            result = GenerationResult([], [], "", {"type": "abort", "message": "Abort in waiting queue"})
            spans = version_spans([], self.weight_version, 0)
            p.future.set_result(Completion(result, self.weight_version, time.perf_counter() - p.enqueued_at, spans))
            self.num_finished += 1

    async def _next_batch(self) -> list[_Pending]:
        while not self._admitting or not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()
        batch = [self._queue.popleft()]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch_size:
            more = self._take_same_adapter(batch[0].req.lora)
            if more is not None:
                batch.append(more)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._admitting:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                break
        return batch

    def _joiners(self, lora: str | None, room: int) -> list[_Pending]:
        """Queued requests that join the running batch of adapter `lora` now: at most `room`, taken from the head
        of the queue while it holds that adapter's (one of another adapter there stops joining: the batch then
        drains and that request's batch comes next)."""
        joining: list[_Pending] = []
        while self._admitting and len(joining) < room and self._queue and self._queue[0].req.lora == lora:
            p = self._queue.popleft()
            if not p.future.done():
                joining.append(p)
        return joining

    def _prepare(self, lora: str | None) -> None:
        """On the model thread, under `lock`, before a batch's first forward: the memory is there and the LoRA slot
        runs `lora`."""
        self._check_not_released()
        if self.lora is not None:
            self.lora.check_request(lora)  # unloaded while queued
            if self.lora.use(lora):
                self.generator.flush_cache()  # cached prefixes were computed with the adapter switched the other way

    def _generate_batch(self, reqs: list[GenerationRequest]) -> list[GenerationResult]:
        with self.lock:
            self._prepare(reqs[0].lora)
            return self.generator.generate(reqs)

    def _advance(self, batch: RunningBatch, joining: list[_Pending]) -> list[tuple[_Pending, GenerationResult]]:
        """On the model thread: prefill `joining` into `batch` (its first rows prepare the model), then one decode
        step. Returns the rows that finished, with their results."""
        with self.lock:
            finished = []
            if joining:
                if not batch:
                    self._prepare(joining[0].req.lora)
                finished = batch.add([p.req for p in joining], joining)
            if batch:
                finished += batch.step()
            return finished

    def _finish(self, p: _Pending, result: GenerationResult) -> None:
        if not p.future.done():
            spans = version_spans(p.version_changes, self.weight_version, len(result.output_ids))
            p.future.set_result(Completion(result, self.weight_version, p.started_at - p.enqueued_at, spans))
            self.num_finished += 1

    async def _run_static(self, live: list[_Pending]) -> None:
        """One `Generator.generate` call: every row resolves when the last one ends."""
        started = time.perf_counter()
        for p in live:
            p.started_at = started
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self._generate_batch, [p.req for p in live])
        for p, result in zip(live, results):
            self._finish(p, result)
        logger.debug("batch of %d done in %.3f s", len(live), time.perf_counter() - started)

    async def _run_joining(self, first: list[_Pending]) -> None:
        """Decode `first` one step per executor call; queued requests of its adapter join between steps, and each
        row resolves as soon as it finishes. Returns once no row is left."""
        loop = asyncio.get_running_loop()
        batch, lora, joining = self.generator.new_batch(), first[0].req.lora, first
        self._batch = batch
        while True:
            if not self._released.is_set():
                await self._hold()
            started = time.perf_counter()
            for p in joining:
                p.started_at = started
            finished = await loop.run_in_executor(self._executor, self._advance, batch, joining)
            for p, result in finished:
                self._finish(p, result)
            done = {p for p, _ in finished}
            self._running = [p for p in self._running if p not in done]
            if not batch:
                return
            joining = self._joiners(lora, self.max_batch_size - len(batch))
            self._running += joining

    async def _hold(self) -> None:
        """Wait, between two decode steps, until an in-place pause ends; the model is free meanwhile."""
        self._model_free.set()
        try:
            await self._released.wait()
        finally:
            self._model_free.clear()

    async def _worker(self) -> None:
        while True:
            live = []
            for p in await self._next_batch():
                if p.req.aborted:
                    self._resolve_aborted(p)
                elif not p.future.done():
                    live.append(p)
            if not self._admitting:  # paused, or an exclusive operation came, while the batch was collected
                self._queue.extendleft(reversed(live))
                continue
            if not live:
                continue
            self._running = list(live)
            self._model_free.clear()
            try:
                await (self._run_joining(live) if self.continuous else self._run_static(live))
            except Exception as exc:  # noqa: BLE001 - every waiter must learn about the failure
                if not isinstance(exc, GenerationError):
                    logger.exception("batch of %d requests failed", len(self._running))
                for p in self._running:
                    if not p.future.done():
                        p.future.set_exception(exc)
            finally:
                self._running, self._batch = [], None
                self._model_free.set()
