"""The parts of a rollout step that the synchronous loop (driver.py) and the one-step-async loop
(async_loop.py) share: the loop's start, training, checkpointing and the step's logging and eval."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import ray

from slime.config.schema import RunConfig
from slime.runtime.rollout_manager import ROLLOUT_CLOCK
from slime.runtime.train_group import TrainGroup
from slime.runtime.weight_push import WeightPush
from slime.tracking.tracker import Tracker
from slime.train.setup import TrainSetup, needs_old_log_probs, needs_ref

if TYPE_CHECKING:
    from slime.runtime.driver import RunState


@dataclasses.dataclass
class LoopClock:
    """Wall-clock seconds since the loop began: the `perf/*_at` metrics, so a run's rollout and train
    windows can be compared (the async loop's overlap)."""

    t0: float = dataclasses.field(default_factory=time.time)

    def now(self) -> float:
        return time.time() - self.t0

    def rebase(self, metrics: dict[str, float]) -> None:
        """The rollout manager's `time.time()` stamps (ROLLOUT_CLOCK) as seconds since the loop began."""
        for key in ROLLOUT_CLOCK:
            if key in metrics:
                metrics[key] -= self.t0


def due(rollout_id: int, interval: int | None) -> bool:
    return interval is not None and (rollout_id + 1) % interval == 0


def begin_loop(cfg: RunConfig, state: RunState, start: int, manager, tracker: Tracker, pusher) -> LoopClock:
    """REFERENCE.md §2.2 steps 0-1: the engines get the run's weights (version `start`), then eval at 0.

    On a resume (`start` > 0), metrics.jsonl and samples.jsonl are cut back to the checkpoint, and its eval runs now
    when the crash came before it was logged."""
    state.enter("weight_sync", start - 1)
    if pusher is not None:
        pusher.push(weight_version=start)  # engines hold the run's weights before rollout 0
    if start > 0:
        tracker.resume(cfg.checkpoint.load, start)
        eval_due = due(start - 1, cfg.eval.interval) and not tracker.has_eval(start)
    else:
        eval_due = bool(cfg.eval.interval) and not cfg.eval.skip_eval_before_train
    if eval_due:
        state.enter("eval", start - 1)
        state.last_eval = ray.get(manager.evaluate.remote(start))
        tracker.log(state.last_eval, eval=start)
    return LoopClock()


def timed_train_step(
    cfg: RunConfig,
    rollout_id: int,
    batches,
    actor: TrainGroup,
    critic: TrainGroup | None,
    metrics: dict[str, float],
    *,
    state: RunState,
    clock: LoopClock,
) -> list[dict[str, float]]:
    """`train_step`, timed: `perf/train_time` (s) and its window `perf/train_started_at`/`_ended_at`."""
    metrics["perf/train_started_at"] = clock.now()
    steps = train_step(cfg, rollout_id, batches, actor, critic, metrics, state=state)
    metrics["perf/train_ended_at"] = clock.now()
    metrics["perf/train_time"] = metrics["perf/train_ended_at"] - metrics["perf/train_started_at"]
    return steps


def train_step(
    cfg: RunConfig,
    rollout_id: int,
    batches,
    actor: TrainGroup,
    critic: TrainGroup | None,
    metrics: dict[str, float],
    *,
    state: RunState | None = None,
) -> list[dict[str, float]]:
    """REFERENCE.md §2.2 step 5 on the training groups; adds rollout-side and perf metrics to `metrics`.

    `state` (the driver's) moves from phase log_probs (batch, values, log-probs, advantages) to train.

    Returns the merged actor (+ critic) `train/*` metrics of every optimizer step.
    """
    actor.load_batch(rollout_id, batches)
    if critic is not None:  # PPO: the critic's old values feed the actor's GAE
        critic.load_batch(rollout_id, batches)
        actor.set_column("values", critic.compute_values())
    if needs_ref(cfg.algo):
        metrics.update(actor.compute_log_probs("ref"))
    if needs_old_log_probs(cfg.algo, cfg.train.num_steps_per_rollout):
        metrics.update(actor.compute_log_probs("old"))
    metrics.update(actor.compute_advantages())
    if state is not None:
        state.enter("train", rollout_id)
    result = actor.train(update=rollout_id >= cfg.algo.num_critic_only_steps)
    metrics.update(result["perf"])
    steps = [dict(step) for step in result["steps"]]
    if critic is not None:  # then the critic learns the actor's returns
        critic.set_column("returns", actor.get_column("returns"))
        critic_result = critic.train()
        metrics.update(critic_result["perf"])
        critic_steps = critic_result["steps"]
        steps = [{**(steps[i] if i < len(steps) else {}), **critic_steps[i]} for i in range(len(critic_steps))]
    return steps


def save_if_due(
    cfg: RunConfig,
    state: RunState,
    rollout_id: int,
    manager,
    actor: TrainGroup,
    critic: TrainGroup | None,
    tracker: Tracker,
    metrics: dict[str, float],
    steps: list[dict[str, float]],
) -> None:
    """REFERENCE.md §2.2 step 6: save every `checkpoint.save_interval` rollouts and at the last one.

    The step's records (`steps`, `metrics` so far) are staged with the checkpoint: a resume logs them if the
    run dies between the save and their logging (slime.tracking.continuity)."""
    if not (due(rollout_id, cfg.checkpoint.save_interval) or rollout_id + 1 == cfg.train.num_rollout):
        return
    state.enter("save", rollout_id)
    tracker.stage_step(cfg.checkpoint.save, rollout_id, steps, metrics)
    save_start = time.perf_counter()
    save_checkpoint(cfg, rollout_id, manager, actor, critic, state)
    metrics["perf/save_model_time"] = time.perf_counter() - save_start
    # the run id goes with the checkpoint; plots refreshed (the last save's come with the end of the run)
    tracker.on_save(cfg.checkpoint.save, plot=rollout_id + 1 < cfg.train.num_rollout)


def save_checkpoint(
    cfg: RunConfig, rollout_id: int, manager, actor: TrainGroup, critic: TrainGroup | None, state: RunState
) -> None:
    """Checkpoint every role and the data source; plus an HF export where `checkpoint.save_hf` asks for one.

    The actor goes last: its tracker file, replaced at the very end of its save, is what makes the checkpoint
    the one a resume picks (the critic's and the data source's files of this id exist by then)."""
    ray.get(manager.save.remote(rollout_id, cfg.checkpoint.save))
    state.fault_point("save", rollout_id)  # debug.hang_at=save: a crash mid-save, in tests
    if critic is not None:
        critic.save_checkpoint(rollout_id, TrainSetup.for_critic_save_root(cfg))
    actor.save_checkpoint(rollout_id, cfg.checkpoint.save)
    if cfg.checkpoint.save_hf:
        actor.save_hf(cfg.checkpoint.save_hf.format(rollout_id=rollout_id))


def sync_weights(pusher: WeightPush | None, rollout_id: int, metrics: dict[str, float], restarted: int) -> None:
    """REFERENCE.md §2.2 step 7: push the weights step `rollout_id` trained (version rollout_id + 1)."""
    if pusher is not None:
        metrics.update(pusher.sync(weight_version=rollout_id + 1))
        metrics["rollout/engine_restarts"] += restarted


def finish_rollout(
    cfg: RunConfig,
    state: RunState,
    rollout_id: int,
    manager,
    tracker: Tracker,
    metrics: dict[str, float],
    steps: list[dict[str, float]],
    preview: list[dict],
) -> None:
    """Log the step (its optimizer steps, its metrics, sample previews), then eval when due (§2.2 step 8)."""
    tracker.log_step(rollout_id, steps, metrics)
    if steps:
        metrics.update(steps[-1])
    tracker.log_samples(rollout_id, preview)
    tracker.progress.step_done(rollout_id, metrics)
    if due(rollout_id, cfg.eval.interval):
        state.enter("eval", rollout_id)
        state.last_eval = ray.get(manager.evaluate.remote(rollout_id + 1))
        tracker.log(state.last_eval, eval=rollout_id + 1)
    state.rollouts_completed += 1
    state.last_metrics = metrics
