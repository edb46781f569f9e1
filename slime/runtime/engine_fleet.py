"""The rollout manager's engines: one Ray actor per engine spec, one router per served model, the
external engines, the control calls the loop uses, engines.json, and fault tolerance.

- Launch: every engine actor starts its server on its placement bundles (ports reserved on that node),
  routers launch (or are joined: `router.address`) meanwhile, and each engine registers with its model's
  router once healthy (`worker_type` and PD bootstrap port included). External engines (URLs) register
  with the policy's router and receive its weight syncs, but are never started or stopped.
- Control (`EngineClient`, plain HTTP, every engine of the listed models): flush cache, pause/continue,
  abort every request and wait until idle, release/resume memory by tag (colocation).
- engines.json in the run directory: each engine's rank, model, worker type, URL, server PID and log;
  rewritten whenever an engine (re)starts.
- Fault tolerance (`rollout.fault_tolerance`): a thread probes GET /health of every registered engine;
  one that fails is removed from its router (requests in flight on it fail and the rollout retries them
  through the router, on the others). `recover()` restarts dead engines before the next rollout; the
  caller pushes weights to them and then `register_restarted()` puts them back behind the router.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import ray

from slime.config.schema import FaultToleranceConfig, RolloutConfig
from slime.engine.base import EngineLaunch, get_engine_class
from slime.engine.client import EngineClient
from slime.engine.groups import EngineSpec, ModelSpec, policy_model
from slime.engine.http_client import EngineHTTPError
from slime.engine.router import Router
from slime.runtime.placement import EnginePlacement

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineSlot:
    """One engine the fleet owns: its spec, actor handle, current URL and state."""

    rank: int
    spec: EngineSpec
    actor: Any
    url: Optional[str] = None
    info: dict = dataclasses.field(default_factory=dict)
    registered: bool = False
    dead: bool = False
    restarts: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetSetup:
    """What the fleet needs from the run config."""

    rollout: RolloutConfig
    models: list[ModelSpec]
    specs: list[EngineSpec]
    host: str
    device: str
    colocate: bool
    seed: int
    run_dir: str
    trainer_gpus: int  # the actor's ranks; colocated, training rank i shares rollout bundle i


class EngineFleet:
    """All engines and routers of a run; see the module docstring."""

    def __init__(self, setup: FleetSetup, placements: list[EnginePlacement]):
        if len(placements) != len(setup.specs):
            raise ValueError(f"{len(placements)} engine placements for {len(setup.specs)} engine specs")
        self.setup = setup
        self.placements = placements
        self.log_dir = Path(setup.run_dir) / "logs"
        self.slots: list[EngineSlot] = []
        self.routers: dict[str, Router] = {}
        self.external = list(setup.rollout.external_engines)
        self.policy = policy_model(setup.models)
        self._lock = threading.Lock()
        self._monitor_stop = threading.Event()
        self._monitor: Optional[threading.Thread] = None
        self._released = False

    # ---- start and stop ---------------------------------------------------------------------------
    def launch(self) -> list:
        """Create the engine actors and have each start its server; returns the launch refs."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        s = self.setup
        engine_cls = get_engine_class(s.rollout.engine)
        remote_cls = ray.remote(engine_cls)
        # An engine's server uses every GPU of its bundles: Ray must not narrow CUDA_VISIBLE_DEVICES to one.
        env = (
            {"runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}
            if s.device == "cuda"
            else {}
        )
        paths = {m.name: m.model_path for m in s.models}
        for rank, (spec, placement) in enumerate(zip(s.specs, self.placements)):
            config = engine_cls.config_from(s.rollout, worker_type=spec.worker_type, overrides=spec.overrides)
            launch = EngineLaunch(
                rank=rank,
                model_path=paths[spec.model],
                host=s.host,
                seed=s.seed + rank,
                device=s.device,
                log_dir=str(self.log_dir),
                gpu_ids=placement.gpu_ids,
                startup_timeout_s=getattr(config, "startup_timeout_s", 600.0),
                memory_saver=s.colocate,
            )
            options = placement.first.actor_options(fraction=0.2 if s.colocate else 1.0)
            actor = remote_cls.options(**options, **env).remote(launch, config)
            self.slots.append(EngineSlot(rank=rank, spec=spec, actor=actor))
        return [slot.actor.launch.remote() for slot in self.slots]

    def start_routers(self) -> None:
        """Launch (or join) one router per served model while the engines come up."""
        for model in self.setup.models:
            router_cls = get_engine_class(self.setup.rollout.engine).router_class
            if model.router.address:
                self.routers[model.name] = router_cls.connect(model.router.address)
                continue
            pd = any(spec.model == model.name and spec.worker_type != "regular" for spec in self.setup.specs)
            log = self.log_dir / ("router.log" if len(self.setup.models) == 1 else f"router_{model.name}.log")
            self.routers[model.name] = router_cls.launch(host=self.setup.host, cfg=model.router, log_path=log, pd=pd)

    def finish_start(self) -> None:
        """Wait for every engine, register each (and the external engines), write engines.json, start the monitor."""
        urls = ray.get([slot.actor.wait_until_ready.remote() for slot in self.slots])
        for slot, url in zip(self.slots, urls):
            slot.url = url
        self._describe_all()
        for slot in self.slots:
            self._register(slot)
        for url in self.external:
            self.routers[self.policy.name].add_worker(url)
        self.write_engines_json()
        if self.setup.rollout.fault_tolerance.enabled:
            self._monitor = threading.Thread(target=self._monitor_loop, name="engine-health", daemon=True)
            self._monitor.start()

    def _register(self, slot: EngineSlot) -> None:
        bootstrap = slot.info.get("bootstrap_port")
        self.routers[slot.spec.model].add_worker(slot.url, worker_type=slot.spec.worker_type, bootstrap_port=bootstrap)
        slot.registered = True

    def _describe_all(self) -> None:
        for slot, info in zip(self.slots, ray.get([slot.actor.describe.remote() for slot in self.slots])):
            slot.info = info

    def shutdown(self) -> None:
        """Deregister every engine (external ones included), stop ours and the routers we launched."""
        self._monitor_stop.set()
        for slot in self.slots:
            if slot.registered:
                self._deregister(slot)
        for url in self.external:
            self._try(lambda u=url: self.routers[self.policy.name].remove_worker(u), f"deregistering {url}")
        for slot in self.slots:
            self._try(lambda a=slot.actor: ray.get(a.shutdown.remote()), f"stopping engine {slot.rank}")
        self.slots = []
        for router in self.routers.values():
            router.shutdown()
        self.routers = {}

    def _deregister(self, slot: EngineSlot) -> None:
        slot.registered = False
        if slot.url:
            self._try(lambda: self.routers[slot.spec.model].remove_worker(slot.url), f"deregistering {slot.url}")

    @staticmethod
    def _try(call: Callable[[], Any], what: str) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - teardown and recovery go on past one failure
            logger.warning("%s failed: %s", what, exc)

    # ---- what the loop reads ----------------------------------------------------------------------
    def router_url(self) -> str:
        """The policy model's router: what the default rollout function sends requests to."""
        return self.routers[self.policy.name].url

    def model_routers(self) -> dict[str, str]:
        """Every served model's router URL by model name (for custom rollout functions)."""
        return {name: router.url for name, router in self.routers.items()}

    def sync_urls(self) -> list[str]:
        """Engines that receive weight syncs: every live engine of an updatable model, then the external ones."""
        updatable = {m.name for m in self.setup.models if m.update_weights}
        ours = [slot.url for slot in self.slots if slot.spec.model in updatable and not slot.dead]
        return ours + self.external

    def tensor_handle_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Per engine of `sync_urls()`, the training rank colocated with each of its TP ranks (-1: none);
        empty unless colocated (external engines: none)."""
        if not self.setup.colocate:
            return ()
        updatable = {m.name for m in self.setup.models if m.update_weights}
        ranks, first = [], 0
        for slot in self.slots:  # engine bundles are consecutive from bundle 0, in slot order
            if slot.spec.model in updatable and not slot.dead:
                bundles = range(first, first + slot.spec.num_gpus)
                ranks.append(tuple(b if b < self.setup.trainer_gpus else -1 for b in bundles))
            first += slot.spec.num_gpus
        return tuple(ranks)

    def num_generating_engines(self) -> int:
        return sum(1 for slot in self.slots if slot.spec.model == self.policy.name) + len(self.external)

    def clients(self, *, updatable_only: bool = False) -> list[EngineClient]:
        urls = self.sync_urls() if updatable_only else [s.url for s in self.slots if not s.dead] + self.external
        return [self.client(url) for url in urls]

    def client(self, url: str) -> EngineClient:
        """The control client of this fleet's engine kind (`rollout.engine`) for the server at `url`."""
        return get_engine_class(self.setup.rollout.engine).client_class(url)

    def write_engines_json(self) -> Path:
        """`<run dir>/engines.json`: one entry per engine (rank, model, worker type, url, pid, log, restarts)."""
        entries = [
            {**slot.info, "model": slot.spec.model, "worker_type": slot.spec.worker_type, "restarts": slot.restarts}
            for slot in self.slots
        ]
        entries += [{"url": url, "external": True, "model": self.policy.name} for url in self.external]
        path = Path(self.setup.run_dir) / "engines.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"engines": entries}, indent=2) + "\n")
        tmp.replace(path)  # readers never see half a file
        return path

    # ---- control calls ----------------------------------------------------------------------------
    def _each(self, call: Callable[[EngineClient], Any], *, updatable_only: bool = False) -> list:
        clients = self.clients(updatable_only=updatable_only)
        if not clients:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(clients))) as pool:
            return list(pool.map(call, clients))

    def flush_cache(self) -> None:
        self._each(lambda c: c.flush_cache())

    def pause_generation(self) -> None:
        self._each(lambda c: c.pause_generation())

    def continue_generation(self) -> None:
        self._each(lambda c: c.continue_generation())

    def abort_and_wait_idle(self, timeout_s: float = 60.0) -> None:
        """Abort every request on every engine, then wait until none reports running or waiting requests.
        With fault tolerance, an engine that does not answer is marked dead instead of failing the call."""
        if not self.setup.rollout.fault_tolerance.enabled:
            self._each(lambda c: c.abort_all_and_wait_idle(timeout_s=timeout_s))
            return
        for slot in self.slots:
            if slot.dead:
                continue
            try:
                self.client(slot.url).abort_all_and_wait_idle(timeout_s=timeout_s)
            except EngineHTTPError as exc:
                self.mark_dead(slot.rank, f"did not answer abort_request ({exc})")
        for url in self.external:
            self.client(url).abort_all_and_wait_idle(timeout_s=timeout_s)

    def release_memory(self) -> None:
        """Colocation, before training: flush the cache, then release every tag (weights, kv_cache, cuda_graph)."""
        self._released = True  # no health checks until the KV cache is back: a released engine cannot generate
        self._each(lambda c: (c.flush_cache(), c.release_memory()), updatable_only=True)

    def resume_memory(self, tags: list[str]) -> None:
        """Colocation: resume `tags` (["weights"] before the push, ["kv_cache", "cuda_graph"] after it)."""
        self._each(lambda c: c.resume_memory(tags), updatable_only=True)
        if "kv_cache" in tags:
            self._released = False

    # ---- fault tolerance --------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        ft: FaultToleranceConfig = self.setup.rollout.fault_tolerance
        while not self._monitor_stop.wait(ft.health_check_interval_s):
            for slot in list(self.slots):
                if slot.dead or not slot.registered or self._released:
                    continue
                if not self.client(slot.url).is_healthy("/health", timeout=ft.health_check_timeout_s):
                    self.mark_dead(slot.rank, "failed its health check")

    def mark_dead(self, rank: int, why: str) -> None:
        """Take engine `rank` out of its router; `recover()` restarts it."""
        with self._lock:
            slot = self.slots[rank]
            if slot.dead:
                return
            slot.dead = True
        logger.error("engine %d at %s (pid %s) %s: removed from its router", rank, slot.url, slot.info.get("pid"), why)
        self._deregister(slot)

    def dead_ranks(self) -> list[int]:
        return [slot.rank for slot in self.slots if slot.dead]

    def recover(self) -> list[int]:
        """Restart every dead engine (not yet registered: it needs the current weights first); returns their
        ranks. Raises RuntimeError when an engine died more than `max_restarts` times."""
        ft = self.setup.rollout.fault_tolerance
        for slot in self.slots:  # the monitor may not have probed since the engine died
            if not slot.dead and not self.client(slot.url).is_healthy("/health", timeout=ft.health_check_timeout_s):
                self.mark_dead(slot.rank, "failed its health check")
        dead = [slot for slot in self.slots if slot.dead]
        for slot in dead:
            if slot.restarts >= ft.max_restarts:
                raise RuntimeError(
                    f"engine {slot.rank} died {slot.restarts + 1} times (rollout.fault_tolerance.max_restarts="
                    f"{ft.max_restarts}); its log: {slot.info.get('log')}"
                )
            slot.restarts += 1
            ray.get(slot.actor.shutdown.remote())  # reaps the dead process, frees its ports
        urls = ray.get([slot.actor.start.remote() for slot in dead])
        for slot, url in zip(dead, urls):
            slot.url, slot.dead = url, False
            logger.warning("engine %d restarted at %s (restart %d)", slot.rank, url, slot.restarts)
        if dead:
            self._describe_all()
            self.write_engines_json()
        return [slot.rank for slot in dead]

    def register_restarted(self, ranks: list[int]) -> None:
        """Put restarted (and re-synced) engines back behind their routers."""
        for rank in ranks:
            self._register(self.slots[rank])
