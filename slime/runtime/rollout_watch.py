"""The driver's wait for a train rollout, with the rollout's group counts for the progress display meanwhile.

The rollout manager answers `progress()` on its own thread (its `concurrency_groups`, rollout_manager.ACTOR_OPTIONS)
while `generate` runs on the default one, so polling never queues behind the rollout it watches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray


def generate_watched(manager, rollout_id: int, on_groups: Callable[..., None], poll_s: float | None) -> Any:
    """`manager.generate(rollout_id)`'s result; every `poll_s` seconds meanwhile (None: never) and once at the end,
    `on_groups(rollout_id, counts[, final=True])` with the rollout's group counts (the progress display)."""
    ref = manager.generate.remote(rollout_id)
    if poll_s is None:
        return ray.get(ref)
    while not ray.wait([ref], timeout=poll_s)[0]:
        current, counts = ray.get(manager.progress.remote())
        if current == rollout_id:  # not the previous step's counts, before this one began
            on_groups(rollout_id, counts)
    result = ray.get(ref)
    current, counts = ray.get(manager.progress.remote())
    if current == rollout_id:
        on_groups(rollout_id, counts, final=True)
    return result
