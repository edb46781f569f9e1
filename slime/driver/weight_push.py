"""Getting new weights into the engines: the colocated memory hand-off and restarted engines.

Colocated (`cluster.colocate=true`, docs/architecture.md#colocated-hand-off), in this exact order:

    push:         train offload -> engines resume "weights" -> weight sync -> engines resume "kv_cache", "cuda_graph"
    before train: engines flush + release every tag -> train onload

Disaggregated, a push is the weight sync alone (it pauses, flushes and continues generation itself).
Every step of the hand-off is logged as it starts ("hand-off step STEP (rollout ID)", HANDOFF_LOG), so the run's
log shows the order; on GPU the same calls free and retake memory.

Every push is bracketed by the rollout manager's `begin_push` / `end_push`: the engines' health checks rest
from its first step to its last (a paused SGLang engine does not answer /health; slime/engine/health.py).

With fault tolerance, dead engines are restarted inside the push, after the trainer went off the GPUs
(colocated), and come up with their memory released, as slime's recovery does: the push then resumes their
weights with everyone's (hand-off step `engine_restart`). The weight sync is reconnected (the distributed
group is rebuilt for the new URLs), the weights are pushed, and only then do the restarted engines rejoin
their router. `sync()` is the loop's push; `recover()` runs before each rollout and pushes only when an
engine died since.

An engine that dies during a push (its server gone when the push reaches it, or in the middle of a transfer) fails
the push naming it (`EngineDied`: rank, URL, pid, log), never only with the connection error. With fault tolerance
the dead engine is restarted and the whole push made again to every engine, as often as `max_restarts` allows: the
others may hold half of the new weights, and every mode's push is whole or repeated (a distributed sync rebuilds its
group for the new URL). With `rollout.weight_sync.on_mismatch=resync` an engine whose weights a verified push found
wrong (slime.sync.verify) is handled as a dead one: restarted, and the push made again to every engine.

A verified push ends with the log-prob probe (slime.sync.probe): each engine generates a fixed prompt, the trainer
scores the tokens on the weights it pushed. Where the push's check runs beside generation, so does the probe: the
engines answer beside the rollout's requests, and the trainer scores them when the check is awaited. Colocated, the trainer is off the GPUs by then: it scores them once it is
back (`before_train`, before the step trains), and an engine found wrong there is restarted by the next push (resync)
or stops the run.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import ray

from slime.config.schema import RunConfig
from slime.driver.events import EventBus, RunEvent
from slime.driver.train_group import TrainGroup
from slime.registry import WEIGHT_SYNC
from slime.rollout.manager.deaths import EngineDied, failure_text
from slime.sync.base import SyncContext
from slime.sync.probe import check_probe, probe_tolerance
from slime.sync.verify import mismatched_engines

logger = logging.getLogger(__name__)

HANDOFF_LOG = "hand-off step %s (rollout %d)"
RESUME_WEIGHTS = ["weights"]
RESUME_REST = ["kv_cache", "cuda_graph"]


CHECK_TIMES = ("perf/update_weights_verify_time", "perf/update_weights_probe_time")
PROBE_DIFFS = ("rollout/weight_probe_logprob_diff", "rollout/weight_probe_logprob_diff_max")


def check_figures(pushed: dict[str, float]) -> dict[str, float]:
    """Take the checks' figures (CHECK_TIMES, PROBE_DIFFS) out of a push's metrics; returns them."""
    return {key: pushed.pop(key) for key in (*CHECK_TIMES, *PROBE_DIFFS) if key in pushed}


def merge_checks(into: dict[str, float], pushed: dict[str, float]) -> None:
    """Add checks' figures to a step's metrics that may hold another's (a step's record holds the checks of the push
    its rollout was generated after, and the last step's also its own push's): check times add up, probe differences
    keep the larger; every other figure is the later one."""
    for key, value in pushed.items():
        if key in into and key in CHECK_TIMES:
            into[key] += value
        elif key in into and key in PROBE_DIFFS:
            into[key] = max(into[key], value)
        else:
            into[key] = value


class DueChecks:
    """The figures of a push's checks, held for the record of the step that trains next: a push's checks land there
    wherever they ran (inside the push, or beside the rollout after it), as they do on a resume."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}

    def hold(self, pushed: dict[str, float]) -> None:
        """Take the checks' figures out of a push's metrics (`check_figures`) until `land`."""
        self.figures = check_figures(pushed)

    def land(self, metrics: dict[str, float], awaited: dict[str, float]) -> None:
        """Into a step's metrics: the figures held, and those of the check awaited now (`merge_checks`)."""
        merge_checks(metrics, self.figures)
        merge_checks(metrics, awaited)
        self.figures = {}


class WeightPush:
    """The driver's side of weight pushes; see the module docstring."""

    def __init__(self, cfg: RunConfig, manager, actor: TrainGroup, context: SyncContext, events: EventBus):
        self.cfg = cfg
        self.events = events
        self.manager = manager
        self.actor = actor
        self.context = context
        self.colocate = cfg.cluster.colocate
        self.fault_tolerance = cfg.rollout.fault_tolerance.enabled
        self.resync = cfg.rollout.weight_sync.on_mismatch == "resync"
        self.trainer_on_device = True  # colocated: the trainer builds on the GPUs; each push offloads it
        ws = cfg.rollout.weight_sync
        self.probe_tokens = ws.probe_tokens if ws.verify else 0
        self.probe_tolerance = probe_tolerance(cfg) if self.probe_tokens else 0.0
        self.pending_probe: tuple | None = None  # colocated: (version, answers, shards, seconds) to score at onload
        self.restart_due = False  # colocated: a probe at onload marked engines dead; the next push restarts them
        self.unverified = False  # a push's check runs on the trainer, not awaited yet
        self.probe_beside: tuple | None = None  # (version, the manager's answer) of a probe beside generation

    def connect(self) -> None:
        """(Re)build the weight-sync object on the trainer for the engines' current URLs."""
        mode = self.cfg.rollout.weight_sync.mode
        urls = ray.get(self.manager.urls.remote())
        context = self.context
        if WEIGHT_SYNC.facts(mode).needs_tensor_handle_ranks:
            context = dataclasses.replace(context, tp_trainer_ranks=ray.get(self.manager.tensor_handle_ranks.remote()))
        self.actor.connect_weight_sync(mode, urls, context)

    def _step(self, rollout_id: int, step: str) -> None:
        logger.info(HANDOFF_LOG, step, rollout_id)

    def _control(self, call: str, *args) -> None:
        ray.get(self.manager.engine_control.remote(call, *args))

    def push(self, weight_version: int) -> dict[str, float]:
        """Push the trainer's weights as `weight_version`; returns the sync's `perf/*` metrics."""
        return self._push(weight_version, restart=False)[0]

    def sync(self, weight_version: int, *, defer: bool = True) -> dict[str, float]:
        """The loop's push: with fault tolerance, dead engines are restarted first and pushed to with the
        others, then rejoin their routers; `rollout/engine_restarts` counts them. `defer`: the push's check may run
        beside the generation that follows (`await_verification`)."""
        metrics, ranks = self._push(weight_version, restart=self.fault_tolerance, defer=defer)
        return {**metrics, "rollout/engine_restarts": float(len(ranks))}

    def await_verification(self) -> dict[str, float]:
        """Await the check of the last push where it runs beside generation (`rollout.weight_sync.on_mismatch=fail`),
        then score its probe, whose engines answered beside the rollout: their metrics; raises a WeightMismatchError (the run stops before anything the
        engines generated on those weights trains). A check cut short by an engine's death is not one: with fault
        tolerance the engine restarts, and is pushed to and checked again, before the next rollout."""
        if not self.unverified:
            return {}
        self.unverified = False
        probe, self.probe_beside = self.probe_beside, None
        try:
            metrics = self.actor.weights_verified()
            if probe is not None:
                version, asked = probe
                waited = time.perf_counter()  # the engines answered beside the rollout: only a wait for them counts
                answers, shards = ray.get(asked)
                metrics.update(self._score_probe(version, answers, shards, time.perf_counter() - waited))
            return metrics
        except Exception as exc:  # noqa: BLE001 - re-raised unless an engine's death explains it
            if mismatched_engines(exc) or not self.fault_tolerance:
                raise
            deaths = self._engine_deaths()
            if not deaths:
                raise
            logger.warning("the check of the last push did not finish: %s (%s)", "; ".join(deaths), failure_text(exc))
            return {}

    def recover(self, weight_version: int) -> int:
        """Before a rollout: restart engines that died since the last push, sync them with the current
        weights (`weight_version`), put them back behind their routers; returns how many restarted."""
        if not self.fault_tolerance or not ray.get(self.manager.dead_engines.remote()):
            return 0
        return len(self._push(weight_version, restart=True)[1])

    def _push(self, weight_version: int, *, restart: bool, defer: bool = False) -> tuple[dict[str, float], list[int]]:
        """One push, made again once dead engines restarted where an engine's death failed it (the module
        docstring): (the sync's metrics, the ranks restarted by every attempt). `defer`: its check runs on (the
        trainer's `weights_verified` awaits it), where checks do not run inside the push."""
        verify_metrics = self.await_verification()  # the last push's, where nothing awaited it yet
        ft = self.cfg.rollout.fault_tolerance
        attempts = ft.max_restarts + 1 if self.fault_tolerance or self.resync else 1
        restarted: list[int] = []  # kept across attempts: each rejoins its router once a push succeeded
        restart, self.restart_due = restart or self.restart_due, False
        for attempt in range(attempts):
            try:
                metrics = self._push_once(weight_version, restart=restart or attempt > 0, restarted=restarted)
                self.unverified = self.context.defer_verify  # its check runs on beside generation
                if not defer:
                    metrics.update(self.await_verification())
                return {**verify_metrics, **metrics, **self._probe(weight_version, beside=self.unverified)}, restarted
            except Exception as exc:  # noqa: BLE001 - re-raised unless an engine's death or a resync explains it
                deaths = self._resync(exc, weight_version) or self._engine_deaths()
                if not deaths:
                    raise
                failed = f"the weight push of version {weight_version} failed: {'; '.join(deaths)}"
                failed += f" ({failure_text(exc).splitlines()[0]})"
                if attempt + 1 == attempts:
                    raise EngineDied(failed) from exc
                logger.warning("%s; pushing again to every engine once the engine restarted", failed)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _resync(self, exc: BaseException, weight_version: int) -> list[str]:
        """`rollout.weight_sync.on_mismatch=resync`: the engines a verification found holding other weights are taken
        out of their routers as dead (the next attempt restarts them and pushes to every engine); a line naming each.
        [] when the push failed otherwise."""
        urls = mismatched_engines(exc)
        if not (self.resync and urls):
            return []
        self.context = dataclasses.replace(self.context, corrupt_version=None)  # an injected fault fires once
        why = f"holds other weights than the trainer pushed as version {weight_version}"
        ranks = ray.get(self.manager.mark_engines_dead.remote(list(urls), why))
        return [f"engine {rank} {why}: restarted to be synced again" for rank in ranks]

    def _engine_deaths(self) -> list[str]:
        """What the rollout manager says of dead engines after a failed push ([] when it cannot say)."""
        try:
            return ray.get(self.manager.engine_deaths.remote())
        except Exception as exc:  # noqa: BLE001 - the push's own error is the one to report
            logger.warning("asking the rollout manager for dead engines after a failed push failed: %s", exc)
            return []

    def _push_once(self, weight_version: int, *, restart: bool, restarted: list[int]) -> dict[str, float]:
        """One push, the engines' health checks resting throughout; dead engines it restarts are added to
        `restarted`, and all of those rejoin their routers once the weights are in. Returns the sync's metrics."""
        rollout_id = weight_version - 1
        self._control("begin_push")
        try:
            if self.colocate and self.trainer_on_device:
                self._step(rollout_id, "train_offload")
                self.actor.offload()
                self.trainer_on_device = False
            if restart:
                restarted += self._restart_dead(rollout_id)
            self.events.publish(RunEvent.PUSH_TRANSFER_STARTED, rollout_id)
            if self.colocate:
                self._step(rollout_id, "engine_resume_weights")
                self._control("resume_memory", RESUME_WEIGHTS)
                self._step(rollout_id, "weight_sync")
            metrics = self.actor.update_weights(weight_version=weight_version)
            if self.colocate:
                self._step(rollout_id, "engine_resume_kv_cache")
                self._control("resume_memory", RESUME_REST)
            if restarted:
                ray.get(self.manager.register_engines.remote(sorted(set(restarted))))  # one restarted twice: once
        finally:
            self._control("end_push")
        return metrics

    def before_train(self, rollout_id: int) -> dict[str, float]:
        """Colocated: the engines give their memory back, then the trainer takes its own back and scores the last
        push's probe; returns the probe's metrics. The last push's check, where it runs on, ends first: released
        weights are not what it checks."""
        checked = self.await_verification()
        if not self.colocate:
            return checked
        self._step(rollout_id, "engine_release")
        self._control("release_memory")
        self._step(rollout_id, "train_onload")
        self.actor.onload()
        self.trainer_on_device = True
        if self.pending_probe is None:
            return checked
        version, answers, shards, seconds = self.pending_probe
        self.pending_probe = None
        try:
            return {**checked, **self._score_probe(version, answers, shards, seconds)}
        except Exception as exc:  # noqa: BLE001 - re-raised unless resync takes the engines out
            lines = self._resync(exc, version)
            if not lines:
                raise
            logger.warning("%s; %s", failure_text(exc), "; ".join(lines))
            self.restart_due = True
            return checked

    def _probe(self, weight_version: int, *, beside: bool) -> dict[str, float]:
        """The log-prob probe of the push just made (slime.sync.probe); colocated, the trainer's side waits for its
        onload (`before_train`). `beside` (the push's check runs beside generation): the engines answer beside the
        rollout that follows, and the trainer scores them when the check is awaited (`await_verification`). Its
        metrics: the differences and `perf/update_weights_probe_time` (s: what the probe held the loop)."""
        if not self.probe_tokens:
            return {}
        started = time.perf_counter()
        asked = self.manager.probe_engines.remote(self.probe_tokens)
        if beside and self.trainer_on_device:
            self.probe_beside = (weight_version, asked)
            return {}
        answers, shards = ray.get(asked)
        seconds = time.perf_counter() - started
        if not self.trainer_on_device:
            self.pending_probe = (weight_version, answers, shards, seconds)
            return {}
        return self._score_probe(weight_version, answers, shards, seconds)

    def _score_probe(self, version: int, answers: list, shards: list, seconds: float) -> dict[str, float]:
        """The trainer's log-probs of the engines' probe tokens (every data-parallel rank holds every answer: the
        first shard's owner's are read), compared with theirs; `seconds`: the loop's wait for the engines' side."""
        started = time.perf_counter()
        scored = []
        if shards:
            self.actor.load_batch(version, shards)
            self.actor.compute_log_probs("old")
            scored = ray.get(self.actor.get_column("old_log_probs")[0])
        per_answer = iter(scored)
        trainer = [next(per_answer) if answer.tokens else [] for answer in answers]
        metrics = check_probe(answers, trainer, tolerance=self.probe_tolerance, version=version)
        return {**metrics, "perf/update_weights_probe_time": seconds + time.perf_counter() - started}

    def _restart_dead(self, rollout_id: int) -> list[int]:
        if not ray.get(self.manager.dead_engines.remote()):
            return []
        if self.colocate:
            self._step(rollout_id, "engine_restart")
        ranks = ray.get(self.manager.recover_engines.remote())
        logger.warning("engines %s restarted: they get the trainer's weights before they rejoin", ranks)
        self.connect()  # new URLs (and a new broadcast group for distributed syncs)
        return ranks
