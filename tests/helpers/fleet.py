"""A real engine fleet outside a run: the Ray session, placement group, engine actors (their servers) and the
router, built from a composed config by the code the rollout manager runs at start-up (`RolloutManager.start`).
For tests of the fleet's control calls and fault tolerance without a trainer or a rollout."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ray

from slime.driver.placement import create_placement
from slime.driver.ray_session import ray_session
from slime.driver.rollout_setup import rollout_setup
from slime.plan.derive import derive
from slime.plan.run_plan import plan_run
from slime.rollout.manager.engine_fleet import EngineFleet
from tests.helpers.compose import typed_config


@contextlib.contextmanager
def running_fleet(
    overrides: list[str], run_dir: Path, *, engine_env: dict[str, str] | None = None
) -> Iterator[EngineFleet]:
    """The fleet of the config `overrides` compose, started and registered; shut down (with Ray) on exit.
    `engine_env`: variables every engine server sees (e.g. SGLANG_HEALTH_CHECK_TIMEOUT)."""
    cfg = typed_config(overrides, output_dir=str(run_dir))
    plan = plan_run(cfg, derive(cfg))
    with ray_session(cfg.cluster, num_bundles=plan.roles.num_bundles, log_to_driver=False, env=engine_env):
        placement = create_placement(plan.roles, device=cfg.cluster.device)
        fleet = EngineFleet(rollout_setup(cfg, plan).fleet, placement.rollout)
        try:
            launched = fleet.launch()
            fleet.start_routers()
            ray.get(launched)
            fleet.finish_start()
            yield fleet
        finally:
            fleet.shutdown()


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "the condition") -> None:
    """Poll `condition` every 20 ms; AssertionError naming `what` after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.02)
