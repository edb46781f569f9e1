"""The one-step-async loop (`train.async=true`, REFERENCE.md §2.4): rollout k+1 is generated while step k trains.

    generate(start) -> for each rollout id k:
        wait for rollout k -> launch generate(k+1) -> train k -> save if due
        -> weight sync every rollout.weight_sync.interval steps (and before an eval, and after the last step):
           wait for generate(k+1) first, so weights never change under a running generation
        -> eval if due -> log

Rollout k+1 thus comes from the weights the engines held before step k trained: one version stale
(staleness k+1 - e per sample, recorded by the rollout manager, slime.rollout.staleness), up to the
interval with longer intervals.

Checkpoints: a save of step k runs on the rollout manager after the in-flight generate(k+1) (the manager
serves one call at a time) and writes the data source's cursor from before rollout k+1 drew its prompts.
A resume from step k generates rollout k+1 again, from the same prompts, with the checkpoint's weights:
nothing is lost or trained twice, though rollout k+1's responses are new (an uninterrupted run drew them
from older weights). Disaggregated only: validation refuses `cluster.colocate=true`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import ray

from slime.config.schema import RunConfig
from slime.runtime.steps import begin_loop, due, finish_rollout, save_if_due, sync_weights, timed_train_step
from slime.runtime.train_group import TrainGroup
from slime.runtime.weight_push import WeightPush
from slime.tracking.tracker import Tracker

if TYPE_CHECKING:
    from slime.runtime.driver import RunState


def run_async_loop(
    cfg: RunConfig,
    state: RunState,
    start: int,
    manager,
    actor: TrainGroup,
    critic: TrainGroup | None,
    tracker: Tracker,
    pusher: WeightPush | None,
) -> None:
    """The loop above; the same arguments and metrics as the synchronous loop (driver._loop), plus
    `perf/rollout_wait_time` (s the step waited for its rollout), `perf/rollout_overlap_time` (s of its
    generation that ran while the previous step trained) and `perf/sync_wait_time` (s a weight sync waited
    for the in-flight generation)."""
    clock = begin_loop(cfg, state, start, manager, tracker, pusher)
    last = cfg.train.num_rollout - 1
    in_flight = manager.generate.remote(start) if start <= last else None
    train_window = None  # the previous step's (start, end), loop seconds
    for rollout_id in range(start, last + 1):
        step_start = time.perf_counter()
        state.enter("rollout", rollout_id)
        batches, metrics, preview = ray.get(in_flight)
        clock.rebase(metrics)
        metrics["perf/rollout_wait_time"] = time.perf_counter() - step_start
        if train_window is not None:
            overlap = min(train_window[1], metrics["perf/rollout_ended_at"])
            overlap -= max(train_window[0], metrics["perf/rollout_started_at"])
            metrics["perf/rollout_overlap_time"] = max(overlap, 0.0)
        in_flight, restarted = None, 0
        if rollout_id < last:
            # engines that died are restarted and get the current weights before the next rollout starts
            restarted = pusher.recover(weight_version=rollout_id) if pusher is not None else 0
            in_flight = manager.generate.remote(rollout_id + 1)
        state.enter("log_probs", rollout_id)
        steps = timed_train_step(cfg, rollout_id, batches, actor, critic, metrics, state=state, clock=clock)
        train_window = (metrics["perf/train_started_at"], metrics["perf/train_ended_at"])
        save_if_due(cfg, state, rollout_id, manager, actor, critic, tracker, metrics, steps)
        if pusher is not None:  # a sync below adds the engines it restarted itself
            metrics["rollout/engine_restarts"] = float(restarted)
        if _sync_due(cfg, rollout_id):
            state.enter("weight_sync", rollout_id)
            if in_flight is not None:  # the engines finish rollout k+1 with the weights it started with
                wait_start = time.perf_counter()
                ray.wait([in_flight])
                metrics["perf/sync_wait_time"] = time.perf_counter() - wait_start
            sync_weights(pusher, rollout_id, metrics, restarted)
        metrics["perf/step_time"] = time.perf_counter() - step_start
        finish_rollout(cfg, state, rollout_id, manager, tracker, metrics, steps, preview)


def _sync_due(cfg: RunConfig, rollout_id: int) -> bool:
    """Every rollout.weight_sync.interval steps, after the last one, and before each eval (evals see the
    trained weights)."""
    last = rollout_id + 1 == cfg.train.num_rollout
    return due(rollout_id, cfg.rollout.weight_sync.interval) or last or due(rollout_id, cfg.eval.interval)
