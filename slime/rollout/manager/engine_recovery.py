"""The fleet's fault tolerance (`rollout.fault_tolerance`, engine_fleet.py's docstring): which engines the
health monitor probes, marking one dead (out of its router), finding engines whose server process is gone, and
restarting them (an engine spanning nodes whole: every node's server); restarting a router this run launched that
died, on its own port, with its engines registered again.

A mixin of `EngineFleet`: it reads the fleet's slots, routers, setup, lock and released-memory record, and uses its
register, deregister, describe and release steps.
"""

from __future__ import annotations

import logging
import time

import ray

from slime.rollout.manager.deaths import RouterDied
from slime.rollout.manager.engine_nodes import EngineActors, ask_each, get_failing_fast

logger = logging.getLogger(__name__)

DEATH_SETTLE_S = 3.0  # how long a failed call's engines may take to show a SIGKILLed server as exited


class FleetRecovery:
    """Probe targets, dead engines and their restart, on an `EngineFleet`."""

    def probe_targets(self) -> list[tuple[int, str]]:
        """(rank, url) of every engine the health monitor probes: ours, registered and not dead."""
        return [(slot.rank, slot.url) for slot in list(self.slots) if slot.registered and not slot.dead]

    def mark_dead(self, rank: int, why: str) -> None:
        """Take engine `rank` out of its router; `recover()` restarts it."""
        with self._lock:
            slot = self.slots[rank]
            if slot.dead:
                return
            slot.dead = True
        logger.error("engine %d at %s (pid %s) %s: removed from its router", rank, slot.url, slot.info.get("pid"), why)
        self._deregister(slot)

    def mark_dead_at(self, urls: list[str], why: str) -> list[int]:
        """`mark_dead` each engine serving at one of `urls`; returns their ranks."""
        ranks = [slot.rank for slot in self.slots if slot.url in urls]
        for rank in ranks:
            self.mark_dead(rank, why)
        return ranks

    def dead_ranks(self) -> list[int]:
        return [slot.rank for slot in self.slots if slot.dead]

    def find_dead(self) -> list[int]:
        """Mark dead each engine whose server process has exited (the probes rest while engines are held, and
        a held engine is not to be probed), then return every dead rank."""
        live = [slot for slot in self.slots if not slot.dead]
        for slot, answers in zip(live, ask_each([slot.actors for slot in live], "is_running")):
            if not all(answers):  # one node's server gone: the whole engine is
                self.mark_dead(slot.rank, "has no server process")
        return self.dead_ranks()

    def engine_deaths(self, settle_s: float = DEATH_SETTLE_S) -> list[str]:
        """A line for each of our engines that is dead: found so by the health checks, or whose server process is
        gone (nothing marked here: what a failed rollout or push names), or for engine actors that did not answer.

        A call that failed on a server killed a moment ago (its connection reset) can get here while the process is
        still exiting: with none found dead, the servers are asked again for up to `settle_s` seconds."""
        deadline = time.monotonic() + settle_s
        while not (deaths := self._engine_deaths()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return deaths

    def _engine_deaths(self) -> list[str]:
        lines = [
            f"engine {slot.rank} at {slot.url} was found dead (removed from its router)"
            for slot in self.slots
            if slot.dead
        ]
        live = [slot for slot in self.slots if not slot.dead]
        try:
            answers = ask_each([slot.actors for slot in live], "is_running")
        except Exception as exc:  # noqa: BLE001 - an engine actor that died with its server is the finding
            return [*lines, f"the engine actors did not answer ({type(exc).__name__}: {exc})"]
        return lines + [
            f"engine {slot.rank} at {slot.url} (pid {slot.info.get('pid')}) has no server process; its log: "
            f"{slot.info.get('log')}"
            for slot, running in zip(live, answers)
            if not all(running)
        ]

    def recover(self) -> list[int]:
        """Restart every dead engine (not yet registered: it needs the current weights first); returns their
        ranks. Colocated, each releases its memory once up. Raises RuntimeError when an engine died more than
        `max_restarts` times."""
        ft = self.setup.rollout.fault_tolerance
        dead = [self.slots[rank] for rank in self.find_dead()]
        for slot in dead:
            if slot.restarts >= ft.max_restarts:
                raise RuntimeError(
                    f"engine {slot.rank} died {slot.restarts + 1} times (rollout.fault_tolerance.max_restarts="
                    f"{ft.max_restarts}); its log: {slot.info.get('log')}"
                )
            slot.restarts += 1
            ray.get([actor.shutdown.remote() for actor in slot.actors])  # reaps the dead processes, frees ports
            self._released.pop(slot.url, None)
        started = [EngineActors(slot.actor, slot.followers).start_refs() for slot in dead]
        answers = get_failing_fast([refs[0] for refs in started] + [ref for refs in started for ref in refs[1:]])
        urls = answers[: len(started)]
        for slot, url in zip(dead, urls):
            slot.url, slot.dead = url, False
            logger.warning("engine %d restarted at %s (restart %d)", slot.rank, url, slot.restarts)
        if dead:
            self._describe_all()
            self.write_engines_json()
        if dead and self.setup.colocate:  # as slime's recovery: released first, then resumed with the others
            self._release([url for url in self.sync_urls() if url in urls])
        return [slot.rank for slot in dead]

    def restart_routers(self) -> list[str]:
        """Restart each router this run launched whose process died, on its own port (the rollout's URL stays), and
        register its model's live engines with it again (the policy's: the external engines too); returns the
        models whose router restarted. RouterDied past `max_restarts` restarts of one router."""
        ft = self.setup.rollout.fault_tolerance
        restarted = []
        for model, router in self.routers.items():
            death = router.death()
            if death is None:
                continue
            count = self._router_restarts.get(model, 0)
            if count >= ft.max_restarts:
                raise RouterDied(f"{death}\n(restarted {count} times: rollout.fault_tolerance.max_restarts={count})")
            self._router_restarts[model] = count + 1
            logger.warning("%s; restarting it (restart %d)", death.split("; log tail")[0], count + 1)
            router.start_process()
            listed = {worker.get("url") for worker in router.list_workers()}  # a PD vllm-router starts with them
            for slot in self.slots:
                if slot.spec.model == model and slot.registered and not slot.dead and slot.url not in listed:
                    self._register(slot)
            if self.policy is not None and model == self.policy.name:
                for url in self.external:
                    if url not in listed:
                        router.add_worker(url)
            restarted.append(model)
        if restarted:
            self.write_engines_json()
        return restarted

    def register_restarted(self, ranks: list[int]) -> None:
        """Put restarted (and re-synced) engines back behind their routers."""
        for rank in ranks:
            self._register(self.slots[rank])
