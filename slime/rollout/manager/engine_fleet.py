"""The rollout manager's engines: one Ray actor per engine spec, one router per served model, the
external engines, the control calls the loop uses, engines.json, and fault tolerance.

- Launch: every engine actor starts its server on its placement bundles (ports reserved on that node),
  routers launch (or are joined: `router.address`) meanwhile, and each engine registers with its model's
  router once healthy (`worker_type` and PD bootstrap port included). External engines (URLs) register
  with the policy's router and receive its weight syncs, but are never started or stopped.
- Control (`EngineClient`, plain HTTP, every engine of the listed models): flush cache, pause/continue,
  abort every request and wait until idle, release/resume memory by tag (colocation). The fleet knows which
  tags each engine has released and resumes only those: SGLang's scheduler crashes on resuming a tag that was
  not released (`offload_tags.remove` in weight_updater.py: `resume_memory_occupation`).
- engines.json in the run directory: each engine's rank, model, worker type, URL, server PID and log;
  rewritten whenever an engine (re)starts.
- Fault tolerance (`rollout.fault_tolerance`): a thread probes GET /health of every registered engine while
  the engines serve (slime/engine/health.py: never during a weight push, a pause or a memory release); one that
  fails is removed from its router (requests in flight on it fail and the rollout retries them through the
  router, on the others). `recover()` restarts dead engines (found by the probes, or by their server process
  having exited); colocated, each new engine releases its memory at once, as slime's recovery does, so that
  the push resumes its weights like everyone's. The caller pushes weights to them and then
  `register_restarted()` puts them back behind the router.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import ray

from slime.engine.base import EngineLaunch, get_engine_class
from slime.engine.client import EngineClient
from slime.engine.fleet_setup import FleetSetup
from slime.engine.groups import EngineSpec, policy_model
from slime.engine.health import HealthGate, HealthMonitor
from slime.engine.http_client import EngineHTTPError
from slime.engine.router import Router
from slime.rollout.manager.bundles import EnginePlacement
from slime.rollout.manager.engine_nodes import ask_each, create_engine_actors, get_failing_fast
from slime.rollout.manager.engine_recovery import FleetRecovery

logger = logging.getLogger(__name__)
ALL_TAGS = frozenset({"weights", "kv_cache", "cuda_graph"})  # sglang/srt/constants.py: GPU_MEMORY_ALL_TYPES


@dataclasses.dataclass
class EngineSlot:
    """One engine the fleet owns: its spec, actor handle, current URL and state."""

    rank: int
    spec: EngineSpec
    actor: Any  # node rank 0's (the whole engine's inside one node): its URL is the engine's
    followers: list = dataclasses.field(default_factory=list)  # node ranks >= 1 of an engine spanning nodes
    url: Optional[str] = None
    info: dict = dataclasses.field(default_factory=dict)
    registered: bool = False
    dead: bool = False
    restarts: int = 0

    @property
    def actors(self) -> list:
        return [self.actor, *self.followers]


class EngineFleet(FleetRecovery):
    """All engines and routers of a run; see the module docstring."""

    def __init__(self, setup: FleetSetup, placements: list[EnginePlacement]):
        if len(placements) != len(setup.specs):
            raise ValueError(f"{len(placements)} engine placements for {len(setup.specs)} engine specs")
        self.setup = setup
        self.placements = placements
        self.log_dir = Path(setup.run_dir) / "logs"
        self.slots: list[EngineSlot] = []
        self.routers: dict[str, Router] = {}
        self._router_restarts: dict[str, int] = {}  # model name -> times its router was restarted
        self.external = list(setup.rollout.external_engines)
        self.policy = policy_model(setup.models)
        self._lock = threading.Lock()
        self._monitor_stop = threading.Event()
        self.health = HealthGate(wait_s=setup.rollout.fault_tolerance.health_check_timeout_s)
        self._released: dict[str, frozenset[str]] = {}  # engine URL -> memory tags it has released

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
        fraction = 0.2 if s.colocate else 1.0

        def actor_on(place, launch, *, config):
            return remote_cls.options(**place.actor_options(fraction=fraction), **env).remote(launch, config)

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
                node_ip=placement.first.node_ip,
                startup_timeout_s=getattr(config, "startup_timeout_s", 600.0),
                memory_saver=s.colocate,
                dtype=s.dtype,
                return_routed_experts=s.return_routed_experts and self._serves_policy(spec),
                lora=s.lora if self._serves_policy(spec) else None,
            )
            actors = create_engine_actors(functools.partial(actor_on, config=config), launch, placement)
            self.slots.append(EngineSlot(rank=rank, spec=spec, actor=actors.main, followers=actors.followers))
        return [actor.launch.remote() for slot in self.slots for actor in slot.actors]

    def _serves_policy(self, spec) -> bool:
        return self.policy is not None and spec.model == self.policy.name

    def start_routers(self) -> None:
        """Launch (or join) one router per served model while the engines come up."""
        for model in self.setup.models:
            router_cls = get_engine_class(self.setup.rollout.engine).router_class
            if model.router.address:
                self.routers[model.name] = router_cls.connect(model.router.address)
                continue
            pd = any(spec.model == model.name and spec.worker_type != "regular" for spec in self.setup.specs)
            log = self.log_dir / ("router.log" if len(self.setup.models) == 1 else f"router_{model.name}.log")
            self.routers[model.name] = router_cls.launch(
                host=self.setup.host, cfg=model.router, log_path=log, pd=pd, node_ip=ray.util.get_node_ip_address()
            )

    def finish_start(self) -> None:
        """Wait for every engine, register each (and the external engines), write engines.json, start the monitor."""
        mains = [slot.actor.wait_until_ready.remote() for slot in self.slots]
        followers = [actor.wait_until_ready.remote() for slot in self.slots for actor in slot.followers]
        urls = get_failing_fast(mains + followers)[: len(mains)]
        for slot, url in zip(self.slots, urls):
            slot.url = url
        self._describe_all()
        for slot in self.slots:
            self._register(slot)
        for url in self.external:
            self.routers[self.policy.name].add_worker(url)
        self.write_engines_json()
        if self.setup.rollout.fault_tolerance.enabled:
            HealthMonitor(self.setup.rollout.fault_tolerance, self, self.health, self._monitor_stop).start()

    def _register(self, slot: EngineSlot) -> None:
        bootstrap = slot.info.get("bootstrap_port")
        self.routers[slot.spec.model].add_worker(slot.url, worker_type=slot.spec.worker_type, bootstrap_port=bootstrap)
        slot.registered = True

    def _describe_all(self) -> None:
        """Each engine's entry; an engine spanning nodes lists its other nodes' servers under `nodes`."""
        for slot, infos in zip(self.slots, ask_each([slot.actors for slot in self.slots], "describe")):
            slot.info = {**infos[0], **({"nodes": infos[1:]} if slot.followers else {})}

    def shutdown(self) -> None:
        """Deregister every engine (external ones included), stop ours and the routers we launched."""
        self._monitor_stop.set()
        for slot in self.slots:
            if slot.registered:
                self._deregister(slot)
        for url in self.external:
            self._try(lambda u=url: self.routers[self.policy.name].remove_worker(u), f"deregistering {url}")
        for slot in self.slots:  # node rank 0 first: the other nodes' servers stop with it
            for actor in slot.actors:
                self._try(lambda a=actor: ray.get(a.shutdown.remote()), f"stopping engine {slot.rank}")
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

    def router_deaths(self) -> list[str]:
        """What ended each router this run launched that is no longer running (Router.death); [] when all live."""
        return [death for router in self.routers.values() if (death := router.death()) is not None]

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
        """`<run dir>/engines.json`: one entry per engine (rank, model, worker type, url, pid, log, restarts) and per
        router (model, Router.describe(), restarts)."""
        entries = [
            {**slot.info, "model": slot.spec.model, "worker_type": slot.spec.worker_type, "restarts": slot.restarts}
            for slot in self.slots
        ]
        entries += [{"url": url, "external": True, "model": self.policy.name} for url in self.external]
        routers = [
            {"model": model, **router.describe(), "restarts": self._router_restarts.get(model, 0)}
            for model, router in self.routers.items()
        ]
        path = Path(self.setup.run_dir) / "engines.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"engines": entries, "routers": routers}, indent=2) + "\n")
        tmp.replace(path)  # readers never see half a file
        return path

    # ---- control calls ----------------------------------------------------------------------------
    def _each(self, call: Callable[[EngineClient], Any], *, updatable_only: bool = False) -> list:
        return self._map(call, self.clients(updatable_only=updatable_only))

    @staticmethod
    def _map(call: Callable[[EngineClient], Any], clients: list[EngineClient]) -> list:
        if not clients:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(clients))) as pool:
            return list(pool.map(call, clients))

    def flush_cache(self) -> None:
        self._each(lambda c: c.flush_cache())

    def pause_generation(self) -> None:
        self.health.hold("paused")  # SGLang's /health waits while paused
        self._each(lambda c: c.pause_generation())

    def continue_generation(self) -> None:
        self._each(lambda c: c.continue_generation())
        self.health.release("paused")

    def begin_push(self) -> None:
        """A weight push starts (the driver's): no health probe until `end_push`."""
        self.health.hold("push")

    def end_push(self) -> None:
        self.health.release("push")

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

    def prepare_weight_check(self) -> None:
        """`debug.check_weight_update_equal` (slime's): every updatable engine snapshots the weights it loaded from
        the checkpoint and overwrites them with random values; the run's first push compares (slime.sync.base)."""
        self._each(lambda c: (c.check_weights("snapshot"), c.check_weights("reset_tensors")), updatable_only=True)

    def release_memory(self) -> None:
        """Colocation, before training: flush the cache, then release every tag (weights, kv_cache, cuda_graph)
        each updatable engine still holds."""
        self._release(self.sync_urls())

    def _release(self, urls: list[str]) -> None:
        self.health.hold("released")  # no probe until every engine has its memory back

        def release(client: EngineClient) -> None:
            held = ALL_TAGS - self._released.get(client.url, frozenset())
            if held:
                client.flush_cache()
                client.release_memory(None if held == ALL_TAGS else sorted(held))  # None: every tag
                self._released[client.url] = ALL_TAGS

        self._map(release, [self.client(url) for url in urls])

    def resume_memory(self, tags: list[str]) -> None:
        """Colocation: resume `tags` (["weights"] before the push, ["kv_cache", "cuda_graph"] after it) on each
        updatable engine, those of them it has released (an engine restarted since holds them all)."""
        clients = self.clients(updatable_only=True)

        def resume(client: EngineClient) -> None:
            released = self._released.get(client.url, frozenset())
            wanted = [t for t in tags if t in released]
            if wanted:
                client.resume_memory(wanted)
                self._released[client.url] = released - set(wanted)

        self._map(resume, clients)
        if not any(self._released.get(client.url) for client in clients):
            self.health.release("released")
