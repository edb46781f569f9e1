"""The rollout manager: one CPU actor owning the router, the engines, the data sources and rewards.

Each training rollout runs the configured rollout function, post-processes rewards and splits the step's samples
into one `TrainBatch` per data-parallel rank (slime.rollout.producer), which this actor puts into Ray's
object store itself: the driver receives one reference per shard (plus the step's metrics and a few samples for
the log) and hands each reference to the ranks of its shard, which read it from the store (never through the
driver, slime.driver.train_group). The driver's weight pushes (slime.driver.weight_push) run its engine control
calls, and tell it when a push begins and ends: the engines' health checks rest in between (slime.engine.health).

The driver imports this module to define the actor and loads no torch: the torch side (the producer) is imported
in the actor's own process, once the engines were launched.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, NamedTuple

import ray

from slime.rollout.base import RolloutProgress
from slime.rollout.manager.bundles import EnginePlacement
from slime.rollout.manager.deaths import EngineDied, RouterDied
from slime.rollout.manager.engine_fleet import EngineFleet
from slime.rollout.manager.stack_dump import arm_stack_dump
from slime.rollout.manager.worker_logging import configure_worker_logging
from slime.rollout.setup import RolloutSetup

_CONTROL_CALLS = {
    "flush_cache",
    "pause_generation",
    "continue_generation",
    "abort_and_wait_idle",
    "release_memory",
    "resume_memory",
    "begin_push",
    "end_push",
}

# The manager's `ray.remote` options (Ray takes concurrency groups there, not in .options()): `progress`
# answers on its own thread while `generate` runs, and `probe_engines` on another (a push's probe runs beside the
# rollout that follows it); every other method stays on the one default thread.
ACTOR_OPTIONS = {"num_cpus": 0, "concurrency_groups": {"progress": 1, "probe": 1}}


class RolloutResult(NamedTuple):
    """One train rollout as the driver receives it: small, the training data stays in Ray's object store."""

    shards: list[ray.ObjectRef]  # per data-parallel rank, in rank order: a reference to its TrainBatch
    metrics: dict[str, float]  # the step's rollout-side metrics (`rollout/*`, `perf/*`)
    preview: list[dict]  # a few samples as dicts (Sample.to_dict() + rollout_step), for the sample log


class RolloutManager:
    """Created at once; `start()` brings up the engines, the router and the data sources.

    The producer (torch) is built only after the engines were launched, so that neither the driver nor this
    actor's start-up waits for it.
    """

    def __init__(self, setup: RolloutSetup, engine_placements: list[EnginePlacement]):
        arm_stack_dump()  # the watchdog's stack dump (stack_dump.py)
        configure_worker_logging()  # its records reach logs/workers.log and the terminal (worker_logging.py)
        self.setup = setup
        self.fleet = EngineFleet(setup.fleet, engine_placements)
        self.producer = None  # the RolloutProducer, built by start()
        self.rollout_progress: tuple[int, RolloutProgress] = (-1, RolloutProgress())  # (rollout id, its counts)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Start every engine, then launch (or join) the router and load the data while their servers come
        up; register each engine once healthy. Returns the router URL."""
        s = self.setup
        if s.load_rollout_data is not None:  # replaying dumps: nothing to generate with
            self._load_producer()
            return ""
        launched = self.fleet.launch()
        self.fleet.start_routers()
        self._load_producer()
        ray.get(launched)
        self.fleet.finish_start()
        if s.check_weight_update_equal:  # before a colocated engine releases (and loses) the checkpoint's weights
            self.fleet.prepare_weight_check()
        if s.colocate:  # the trainer builds next: engines give their memory back until the first push
            self.fleet.release_memory()
        return self.fleet.router_url()

    def _load_producer(self) -> None:
        """The producer with its data loaded (a bad data config fails here)."""
        # torch and transformers (~2 CPU-seconds): in the actor's process only, never in the driver's
        from slime.rollout.producer import RolloutProducer

        self.producer = RolloutProducer(self.setup, self.fleet)
        self.producer.load_data()

    def urls(self) -> list[str]:
        """The URL of every engine that receives weight syncs, in engine rank order, then external engines."""
        return self.fleet.sync_urls()

    def tensor_handle_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Per synced engine, the training rank on each TP rank's device (tensor mode, colocated)."""
        return self.fleet.tensor_handle_ranks()

    def engine_control(self, call: str, *args: Any) -> None:
        """Run one of the fleet's control calls on the engines: flush_cache, pause_generation,
        continue_generation, abort_and_wait_idle, release_memory, resume_memory(tags); begin_push and end_push
        bracket a weight push (no health probe in between)."""
        if call not in _CONTROL_CALLS:
            raise ValueError(f"unknown engine control call {call!r}; one of {sorted(_CONTROL_CALLS)}")
        getattr(self.fleet, call)(*args)

    def dead_engines(self) -> list[int]:
        """Ranks of the engines the health checks found dead or whose server process has exited."""
        return self.fleet.find_dead()

    def engine_deaths(self) -> list[str]:
        """A line naming each engine that is dead (rank, URL, pid, log); nothing is marked (a failed push asks)."""
        return self.fleet.engine_deaths()

    def mark_engines_dead(self, urls: list[str], why: str) -> list[int]:
        """Take the engines at `urls` out of their routers as dead, for `recover_engines` to restart (a verified push
        found their weights wrong); returns their ranks."""
        return self.fleet.mark_dead_at(urls, why)

    def recover_engines(self) -> list[int]:
        """Restart dead engines (they get weights next; colocated, they release their memory first); returns
        their ranks."""
        return self.fleet.recover()

    @ray.method(concurrency_group="probe")
    def probe_engines(self, max_new_tokens: int) -> tuple[list[Any], list[ray.ObjectRef]]:
        """The log-prob probe after a push (slime.sync.probe): each synced engine's answer (EngineProbe) and, per
        data-parallel rank, a reference to the batch of those answers for the trainer to score. On its own thread:
        it may run while `generate` does (its requests go to the engines beside the rollout's)."""
        answers, batches = self.producer.probe(self.fleet.sync_urls(), max_new_tokens)
        return answers, [ray.put(batch) for batch in batches]

    def register_engines(self, ranks: list[int]) -> None:
        """Put restarted engines, synced, back behind their routers; train.async=full's groups that failed on them
        run again."""
        self.fleet.register_restarted(ranks)
        if ranks:
            self.producer.restarted()

    def shutdown(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self.fleet.shutdown()

    # ---- rollout -----------------------------------------------------------------------------
    def generate(self, rollout_id: int) -> RolloutResult:
        """One training rollout step (RolloutProducer.rollout_step) with its shards put into Ray's object store:
        this actor owns them, each shard's ranks read them there."""
        counts = RolloutProgress()
        self.rollout_progress = (rollout_id, counts)
        with self._faults_named(f"rollout {rollout_id}", rollout_id):
            batches, metrics, preview = self.producer.rollout_step(rollout_id, counts)
        return RolloutResult([ray.put(batch) for batch in batches], metrics, preview)

    @contextlib.contextmanager
    def _faults_named(self, during: str, rollout_id: int | None = None) -> Iterator[None]:
        """A router this run launched that died before or during `during`, or an engine that died during it,
        fails it naming them: RouterDied with the router's exit status and log, EngineDied with the engine's
        rank, URL and log; never only the requests' errors (a router's 503). For a training rollout
        (`rollout_id`) the data source is first put back where the step began, so that the loop may generate
        it again once fault tolerance restarted what died (an eval draws nothing: it may always run again). With
        fault tolerance, a router found dead before the call is restarted first (FleetRecovery.restart_routers)."""
        dead = self.fleet.router_deaths()
        if dead and self.setup.rollout.fault_tolerance.enabled:
            self.fleet.restart_routers()
            self.producer.restarted()
        elif dead:
            raise RouterDied(f"{during} cannot start: {'; '.join(dead)}")
        try:
            yield
        except Exception as exc:
            routers = self.fleet.router_deaths()
            engines = [] if routers else self.fleet.engine_deaths()
            if not (routers or engines):
                raise
            retryable = rollout_id is None or self.producer.rewind(rollout_id)
            if routers:
                raise RouterDied(f"{during} failed: {'; '.join(routers)}", retryable) from exc
            died = f"{during} failed: {'; '.join(engines)} ({type(exc).__name__}: {exc})"
            raise EngineDied(died, retryable) from exc

    def start_stream(self, trainer_version: int) -> None:
        """train.async=full: generate continuously from now on; `generate` then takes each step's groups."""
        self.producer.start_stream(trainer_version)

    def stop_stream(self) -> None:
        """train.async=full: the last step was taken; abort what is still generating."""
        self.producer.stop_stream()

    @ray.method(concurrency_group="progress")
    def progress(self) -> tuple[int, dict[str, int]]:
        """(rollout id, its group counts so far: RolloutProgress fields) of the latest train rollout."""
        rollout_id, counts = self.rollout_progress
        return rollout_id, dataclasses.asdict(counts)

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Per eval dataset: mean reward, truncation ratio, response length and pass@k (`eval/<name>...`)."""
        with self._faults_named(f"the eval of rollout {rollout_id}"):
            return self.producer.evaluate(rollout_id)

    # ---- state -------------------------------------------------------------------------------
    def save(self, rollout_id: int, root: str) -> None:
        """`<root>/rollout/`: the data source's cursor and buffer, and this actor's generators."""
        self.producer.save_checkpoint(rollout_id, root)

    def load(self, rollout_id: int, root: str) -> None:
        self.producer.load_checkpoint(rollout_id, root)
