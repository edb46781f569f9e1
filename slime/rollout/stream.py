"""train.async=full: groups generated continuously, taken by the trainer in start order (slime.config.async_mode).

A `GroupStream` runs its own event loop on its own thread in the rollout manager's process. It keeps up to
`batch_size` groups in flight (drawn from the data source: handed-back groups first, then fresh prompts), starting
one as soon as one finishes, and the trainer takes `batch_size` finished groups a step in the order they started.
It starts a group only while the groups started and not yet taken, plus those the current step took, number fewer
than `StreamLimits.max_ahead` (AReaL's bound): the group started now is then taken within `max_staleness`
versions, so none is generated only to be dropped. The engines never idle on a long tail: while one step's last
groups decode, the next step's run beside them. It never waits for training otherwise.

A weight push pauses the engines (slime.sync.base). With an in-place pause (`rollout.weight_sync.pause_mode`) the
running requests keep their place and continue on the new weights, and the engine reports each output token's
version (SGLang's `meta_info.weight_versions` spans); with the abort pause a request comes back with its partial
output and is sent again at once, continuing from its tokens with the rest of its budget (the engine holds it until
the push ends). Either way each token keeps the version that generated it (`Sample.token_versions`); with
`rollout.mask_offpolicy_in_partial_rollout` the tokens an older version sampled carry no loss
(slime.rollout.generate.mask_older_tokens), and TIS weighs every token by its own rollout log-prob either way.

`take(trainer_version)` (the manager's thread) hands the trainer the next `batch_size` groups in start order, once
each has finished, and judges each by its oldest token: a group more than `max_staleness` versions behind the
trainer (only after a resume or a version jump) is dropped (counted) or, with `rollout.stale_policy=regenerate`,
handed back to the data source as a fresh prompt. Every prompt drawn is thus trained once, or counted dropped.
`state_dict()` is what a checkpoint keeps: the data source's cursor, the finished groups as they are, the groups in
flight as fresh prompts (a resume generates them again).

With fault tolerance (`StreamLimits.keep_failed`) a group whose generation fails (its engine or router died) is kept
in its place, reset: `take()` raises GroupsFailed once it reaches such a group, with the groups it had taken put
back, and the next `take()` (after the loop restarted what died) runs the failed groups again. `restarted()` (the
manager's, once restarted engines rejoined their routers or a router restarted) runs them again at once, and a
group started before it that fails after it (its requests retried into the outage) runs again in its place rather
than failing a take: what it failed on is back. Without keep_failed the first failure ends the stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any

import aiohttp

from slime.rollout.base import RolloutContext, RolloutProgress, StreamLimits
from slime.rollout.default import reset_sample
from slime.rollout.generate import generate_and_reward
from slime.rollout.staleness import group_staleness
from slime.types import Sample, SampleStatus

logger = logging.getLogger(__name__)

WAIT_POLL_S = 1.0  # take() re-checks the stream's health this often while it waits


class GroupsFailed(RuntimeError):
    """Groups of the step failed their generation and are kept (StreamLimits.keep_failed): the next take runs them
    again."""


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
        self._order: collections.deque[int] = collections.deque()  # started, not yet taken: start order
        self._in_flight: dict[int, list[Sample]] = {}  # start number -> the group being generated
        self._done: dict[int, list[Sample]] = {}  # start number -> the finished group
        self._failed: dict[int, list[Sample]] = {}  # start number -> a group that failed, reset (keep_failed)
        self._failure: BaseException | None = None  # the first error of the groups in _failed
        self._relaunch: list[tuple[int, list[Sample]]] = []  # failed groups back in flight, for _draw to start
        self._restarts = 0  # restarted() calls so far: what failed groups failed on came back this often
        self._started_at: dict[int, int] = {}  # start number -> _restarts when the group (last) started
        self._next_key = 0  # the next group's start number (its key in the maps)
        self._taken = 0  # groups the take at the current version has kept
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
        """Begin generating (after `load_state_dict` on a resume): the steps before `trainer_version` took their
        groups, the restored finished ones come next."""
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
        """The next `batch_size` groups in start order no more than `max_staleness` versions behind
        `trainer_version`, and the step's metrics; blocks until each has finished (counting them in `progress`, for
        the progress display, as they come). Raises what the stream raised."""
        limits, taken, keys = self.limits, [], []
        counts = {"dropped": 0, "regenerated": 0}
        progress = progress if progress is not None else RolloutProgress()
        progress.needed = limits.batch_size
        with self._cond:
            self._version, self._taken = trainer_version, 0
            self._relaunch_failed()  # what made them fail was restarted before this take
            self._wake()  # a newer version: room for more groups
            while len(taken) < limits.batch_size:
                progress.kept, progress.in_flight, progress.submitted = len(taken), len(self._in_flight), self._drawn
                progress.dropped = counts["dropped"] + counts["regenerated"]
                try:
                    key, group = self._next_group()
                except GroupsFailed:
                    self._put_back(keys, taken)
                    raise
                stale = group_staleness(group, trainer_version)
                if stale is None or stale <= limits.max_staleness:
                    taken.append(group)
                    keys.append(key)
                    self._taken += 1
                    continue
                if limits.regenerate_stale:
                    self.data_source.add_groups([[reset_sample(s) for s in group]])
                    counts["regenerated"] += 1
                else:
                    counts["dropped"] += 1
                self._wake()  # its slot goes to the next group, taken in its place
            progress.kept, progress.in_flight, progress.submitted = len(taken), 0, self._drawn
            self._drawn = 0
            metrics = {
                "rollout/buffer_depth": float(len(self._done)),
                "rollout/groups_in_flight": float(len(self._in_flight)),
                "rollout/stale_dropped_groups": float(counts["dropped"]),
                "rollout/stale_regenerated_groups": float(counts["regenerated"]),
                "perf/engine_idle_time": self._take_idle(),
            }
        return taken, metrics

    def restarted(self) -> None:
        """What the failed groups failed on (an engine, a router) restarted and serves: they run again now, and a
        group started before now that fails later runs again too (the module docstring)."""
        with self._cond:
            self._restarts += 1
            self._relaunch_failed()
        self._wake()

    def _relaunch_failed(self) -> None:
        """The failed groups go back in flight, in their places; the stream's loop starts them (the lock held)."""
        self._relaunch += list(self._failed.items())
        self._in_flight.update(self._failed)
        self._failed, self._failure = {}, None

    def _put_back(self, keys: list[int], groups: list[list[Sample]]) -> None:
        """A take that failed gives back the groups it had taken, in their places (the lock held)."""
        self._order.extendleft(reversed(keys))
        self._done.update(zip(keys, groups))
        self._taken -= len(keys)

    def _next_group(self) -> tuple[int, list[Sample]]:
        """(start number, group) of the earliest-started group not yet taken, once it has finished (the lock held);
        GroupsFailed when that group failed and is kept."""
        while not self._order or self._order[0] not in self._done:
            if self._error is not None:
                raise RuntimeError("train.async=full: the rollout stream failed") from self._error
            if self._order and self._order[0] in self._failed:
                raise GroupsFailed(
                    f"train.async=full: {len(self._failed)} group(s) failed their generation and run again at the "
                    f"next take (first error: {type(self._failure).__name__}: {self._failure})"
                ) from self._failure
            drawable = getattr(self.data_source, "buffer", None) or not getattr(self.data_source, "exhausted", False)
            if not self._order and not drawable:
                raise RuntimeError(
                    "train.async=full: the data source ran out (train.num_epoch) with fewer finished groups than "
                    f"rollout.batch_size={self.limits.batch_size}: stale groups were dropped that the run needed"
                )
            self._cond.wait(WAIT_POLL_S)
        key = self._order.popleft()
        return key, self._done.pop(key)

    def _take_idle(self) -> float:
        """Seconds with no group in flight since the last call (the lock held)."""
        now = time.monotonic()
        idle = self._idle_s + (now - self._idle_since if not self._in_flight else 0.0)
        self._idle_s, self._idle_since = 0.0, now
        return idle

    def state_dict(self) -> dict[str, Any]:
        """A consistent snapshot: the data source's state, the finished groups (start order), the groups in flight
        (reset)."""
        with self._cond:
            return {
                "data_source": self.data_source.state_dict(),
                "finished": [[s.to_dict() for s in self._done[k]] for k in self._order if k in self._done],
                "in_flight": [
                    [reset_sample(s).to_dict() for s in self._in_flight.get(k) or self._failed[k]]
                    for k in self._order
                    if k in self._in_flight or k in self._failed
                ],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` (before `start`): the groups that were in flight are generated again."""
        self.data_source.load_state_dict(state["data_source"])
        self.data_source.add_groups([[Sample.from_dict(s) for s in g] for g in state["in_flight"]])
        finished = [[Sample.from_dict(s) for s in g] for g in state["finished"]]
        self._done = dict(enumerate(finished))
        self._order = collections.deque(range(len(finished)))
        self._next_key = len(finished)

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
                for key, group in self._draw():
                    task = asyncio.create_task(self._run_group(key, group, semaphore))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                self._wakeup.clear()
                await self._wakeup.wait()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _draw(self) -> list[tuple[int, list[Sample]]]:
        """The groups to start now, with their start numbers (the module docstring's bounds): failed groups put back
        in flight first."""
        with self._cond:
            drawn, self._relaunch = self._relaunch, []
            for key, _ in drawn:
                self._started_at[key] = self._restarts
            while self._error is None and self._has_room():
                groups = self.data_source.get_groups(1)
                if not groups:
                    break
                if not self._in_flight:
                    self._idle_s += time.monotonic() - self._idle_since
                key, self._next_key = self._next_key, self._next_key + 1
                self._order.append(key)
                self._in_flight[key] = groups[0]
                self._started_at[key] = self._restarts
                self._drawn += 1
                drawn.append((key, groups[0]))
        return drawn

    def _has_room(self) -> bool:
        """Fewer than `batch_size` groups in flight, and fewer started ahead than the staleness bound allows (the
        lock held)."""
        ahead = len(self._order) + self._taken
        return len(self._in_flight) < self.limits.batch_size and ahead < self.limits.max_ahead

    async def _run_group(self, key: int, group: list[Sample], semaphore: asyncio.Semaphore) -> None:
        try:
            done = list(await asyncio.gather(*(self._run_sample(s, semaphore) for s in group)))
            if self.ctx.rewards.group_rm:
                await self.ctx.rewards.reward_group(self.ctx, done, rm_type=self.ctx.rm_type)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - take() re-raises it in the manager's thread
            self._group_failed(key, group, exc)
            return
        with self._cond:
            self._in_flight.pop(key, None)
            self._started_at.pop(key, None)
            if not self._in_flight:
                self._idle_since = time.monotonic()
            self._done[key] = done
            self._cond.notify_all()
        self._wakeup.set()

    def _group_failed(self, key: int, group: list[Sample], exc: Exception) -> None:
        """Without keep_failed the stream's error; with it the group is kept, reset, in its place: run again at once
        when what it failed on restarted since it started, else by the next take or `restarted()`."""
        why, reset = f"{type(exc).__name__}: {exc}", [reset_sample(s) for s in group]
        with self._cond:
            again = self.limits.keep_failed and self._started_at.get(key, self._restarts) < self._restarts
            if again:
                self._in_flight[key] = reset
                self._relaunch.append((key, reset))
            elif self.limits.keep_failed:
                self._in_flight.pop(key, None)
                self._started_at.pop(key, None)
                self._failed[key] = reset
                self._failure = self._failure or exc
            else:
                self._error = exc
            self._cond.notify_all()
        if again:
            logger.warning("group %d failed its generation on what restarted since (%s); running it again", key, why)
            self._wake()
        elif self.limits.keep_failed:
            logger.warning("group %d failed its generation (%s); kept to run again", key, why)

    async def _run_sample(self, sample: Sample, semaphore: asyncio.Semaphore) -> Sample:
        """Generate and reward one sample; a request aborted by a push's pause continues (new weights)."""
        async with semaphore:
            while True:
                sample = await generate_and_reward(
                    self.ctx, sample, self.ctx.sampling_params, rollout_id=self._version, evaluation=False
                )
                if sample.status is not SampleStatus.ABORTED or self._stopping:
                    return sample
