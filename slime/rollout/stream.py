"""train.async=full: groups generated continuously, taken by the trainer as they finish (slime.config.async_mode).

A `GroupStream` runs its own event loop on its own thread in the rollout manager's process. It keeps groups in
flight (drawn from the data source: handed-back groups first, then fresh prompts), starting one as soon as there is
room, and puts each finished group into a FIFO buffer. It starts a group only while
- the groups waiting plus those started since the trainer's last take number fewer than `batch_size`: one step's
  worth is generated ahead (when the trainer is the slower side, more would only age), while groups started before
  the last take and still decoding (a long tail) do not hold new ones back;
- and all groups in flight and waiting number fewer than `batch_size × max_staleness`: the trainer takes
  `batch_size` a step, oldest first, so a group started now is taken within `max_staleness` steps; more would wait
  until too stale and be generated for nothing (AReaL bounds how far generation runs ahead the same way).
It never waits for training otherwise.

A weight push pauses the engines (their default pause aborts what runs, returning the partial output, and holds
what arrives until they continue, slime.sync.base). A sample whose request came back aborted is sent again at
once, continuing from its tokens with the rest of its budget: the engine holds it until the push ends, and the
continuation runs on the new weights. Each token keeps the version that generated it (`Sample.token_versions`);
with `rollout.mask_offpolicy_in_partial_rollout` the earlier tokens of a continued sample carry no loss
(slime.rollout.generate.generate_and_reward), and TIS weighs every token by its own rollout log-prob either way.

`take(trainer_version)` (the manager's thread) hands the trainer `batch_size` finished groups, oldest first, and
judges each by its oldest token: a group more than `max_staleness` versions behind the trainer is dropped (counted)
or, with `rollout.stale_policy=regenerate`, handed back to the data source as a fresh prompt. Every prompt drawn is
thus trained once, or counted dropped. `state_dict()` is what a checkpoint keeps: the data source's cursor, the
finished groups as they are, the groups in flight as fresh prompts (a resume generates them again).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

import aiohttp

from slime.rollout.base import RolloutContext, RolloutProgress, StreamLimits
from slime.rollout.default import reset_sample
from slime.rollout.generate import generate_and_reward
from slime.rollout.staleness import group_staleness
from slime.types import Sample, SampleStatus

WAIT_POLL_S = 1.0  # take() re-checks the stream's health this often while it waits


class GroupStream:
    """Generates groups on its own thread; `take()` gives the trainer each step's.

    Args:
        context: the rollout context of every request (its `session` is set by the stream's loop).
        data_source: where groups come from (and stale ones go back to); the stream's lock guards it.
        limits: see `StreamLimits`.
    """

    def __init__(self, context: RolloutContext, data_source, limits: StreamLimits):
        self.ctx, self.data_source, self.limits = context, data_source, limits
        self._cond = threading.Condition()
        self._finished: collections.deque[list[Sample]] = collections.deque()
        # group index -> (the trainer's version when it started, its samples)
        self._in_flight: dict[int, tuple[int, list[Sample]]] = {}
        self._drawn = 0  # groups started since the last take (the progress display's "drawn")
        self._version = 0  # the trainer's weight version: hooks get it as rollout_id
        self._error: BaseException | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._idle_s, self._idle_since = 0.0, time.monotonic()  # engine idle: no group in flight

    # ---- the manager's side --------------------------------------------------------------------------------
    def start(self, trainer_version: int) -> None:
        """Begin generating (after `load_state_dict` on a resume)."""
        self._version = trainer_version
        self._idle_since = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="rollout-stream", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        try:
            self._loop.run_until_complete(self._produce())
        finally:
            self._loop.close()

    def take(
        self, trainer_version: int, progress: RolloutProgress | None = None
    ) -> tuple[list[list[Sample]], dict[str, float]]:
        """`batch_size` finished groups no more than `max_staleness` versions behind `trainer_version`, oldest
        first, and the step's metrics; blocks until there are that many (counting them in `progress`, for the
        progress display, as they come). Raises what the stream raised."""
        limits, taken = self.limits, []
        counts = {"dropped": 0, "regenerated": 0}
        progress = progress if progress is not None else RolloutProgress()
        progress.needed = limits.batch_size
        with self._cond:
            self._version = trainer_version
            while len(taken) < limits.batch_size:
                progress.kept, progress.in_flight, progress.submitted = len(taken), len(self._in_flight), self._drawn
                progress.dropped = counts["dropped"] + counts["regenerated"]
                group = self._next_finished()
                self._wake()  # room for another group (and a regenerated prompt to draw)
                stale = group_staleness(group, trainer_version)
                if stale is None or stale <= limits.max_staleness:
                    taken.append(group)
                elif limits.regenerate_stale:
                    self.data_source.add_groups([[reset_sample(s) for s in group]])
                    counts["regenerated"] += 1
                else:
                    counts["dropped"] += 1
            # the groups still in flight carry over to the next take (not cut, as a step's leftovers would be)
            progress.kept, progress.in_flight, progress.submitted = len(taken), 0, self._drawn
            self._drawn = 0
            metrics = {
                "rollout/buffer_depth": float(len(self._finished)),
                "rollout/groups_in_flight": float(len(self._in_flight)),
                "rollout/stale_dropped_groups": float(counts["dropped"]),
                "rollout/stale_regenerated_groups": float(counts["regenerated"]),
                "perf/engine_idle_time": self._take_idle(),
            }
        self._wake()
        return taken, metrics

    def _next_finished(self) -> list[Sample]:
        """The oldest finished group (the lock held); waits for one."""
        while not self._finished:
            if self._error is not None:
                raise RuntimeError("train.async=full: the rollout stream failed") from self._error
            drawable = getattr(self.data_source, "buffer", None) or not getattr(self.data_source, "exhausted", False)
            if not self._in_flight and not drawable:
                raise RuntimeError(
                    "train.async=full: the data source ran out (train.num_epoch) with fewer finished groups than "
                    f"rollout.batch_size={self.limits.batch_size}: stale groups were dropped that the run needed"
                )
            self._cond.wait(WAIT_POLL_S)
        return self._finished.popleft()

    def _take_idle(self) -> float:
        """Seconds with no group in flight since the last call (the lock held)."""
        now = time.monotonic()
        idle = self._idle_s + (now - self._idle_since if not self._in_flight else 0.0)
        self._idle_s, self._idle_since = 0.0, now
        return idle

    def state_dict(self) -> dict[str, Any]:
        """A consistent snapshot: the data source's state, the finished groups, the groups in flight (reset)."""
        with self._cond:
            in_flight = [self._in_flight[k][1] for k in sorted(self._in_flight)]
            return {
                "data_source": self.data_source.state_dict(),
                "finished": [[s.to_dict() for s in g] for g in self._finished],
                "in_flight": [[reset_sample(s).to_dict() for s in g] for g in in_flight],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` (before `start`): the groups that were in flight are generated again."""
        self.data_source.load_state_dict(state["data_source"])
        self.data_source.add_groups([[Sample.from_dict(s) for s in g] for g in state["in_flight"]])
        self._finished = collections.deque([Sample.from_dict(s) for s in g] for g in state["finished"])

    def close(self) -> None:
        """Stop starting groups, abort the rest (the stream's loop cancels its tasks), join the thread."""
        self._stopping = True
        self.ctx.aborted = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _wake(self) -> None:
        """Have the stream's loop look for room (from any thread)."""
        if self._loop is not None and self._wakeup is not None:
            try:
                self._loop.call_soon_threadsafe(self._wakeup.set)
            except RuntimeError:  # the loop has ended (closed)
                pass

    # ---- the stream's loop ---------------------------------------------------------------------------------
    async def _produce(self) -> None:
        self._wakeup = asyncio.Event()
        tasks: set[asyncio.Task] = set()
        semaphore = asyncio.Semaphore(self.ctx.max_in_flight)
        connector = aiohttp.TCPConnector(limit=self.ctx.max_in_flight)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            self.ctx.session = session
            while not self._stopping:
                for group in self._draw():
                    task = asyncio.create_task(self._run_group(group, semaphore))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                self._wakeup.clear()
                await self._wakeup.wait()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _draw(self) -> list[list[Sample]]:
        """The groups to start now (the module docstring's bounds)."""
        drawn = []
        with self._cond:
            while self._error is None and self._has_room():
                groups = self.data_source.get_groups(1)
                if not groups:
                    break
                if not self._in_flight:
                    self._idle_s += time.monotonic() - self._idle_since
                index = groups[0][0].group_index
                self._in_flight[index] = (self._version, groups[0])
                self._drawn += 1
                drawn.append(groups[0])
        return drawn

    def _has_room(self) -> bool:
        """Fewer than one step's groups started at the trainer's current version or waiting, and fewer than
        `capacity` in flight and waiting (the lock held)."""
        current = sum(started >= self._version for started, _ in self._in_flight.values())
        waiting = len(self._finished)
        return current + waiting < self.limits.batch_size and len(self._in_flight) + waiting < self.limits.capacity

    async def _run_group(self, group: list[Sample], semaphore: asyncio.Semaphore) -> None:
        try:
            done = list(await asyncio.gather(*(self._run_sample(s, semaphore) for s in group)))
            if self.ctx.rewards.group_rm:
                await self.ctx.rewards.reward_group(self.ctx, done, rm_type=self.ctx.rm_type)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - take() re-raises it in the manager's thread
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._in_flight.pop(group[0].group_index, None)
            if not self._in_flight:
                self._idle_since = time.monotonic()
            self._finished.append(done)
            self._cond.notify_all()
        self._wakeup.set()

    async def _run_sample(self, sample: Sample, semaphore: asyncio.Semaphore) -> Sample:
        """Generate and reward one sample; a request aborted by a push's pause continues (new weights)."""
        async with semaphore:
            while True:
                sample = await generate_and_reward(
                    self.ctx, sample, self.ctx.sampling_params, rollout_id=self._version, evaluation=False
                )
                if sample.status is not SampleStatus.ABORTED or self._stopping:
                    return sample
