"""The training loop: one object holding the run's parts, its step methods, and the loops they make.

The synchronous loop (docs/architecture.md#synchronous-loop), `run_sync`:

    initial weight push -> [eval at 0] -> for each rollout id:
        rollout + rewards -> train (log-probs, advantages, K optimizer steps) -> save if due
        -> weight sync -> log -> eval if due

The one-step-async loop (`train.async=true`, docs/architecture.md#one-step-asynchronous-loop), `run_async`:

    generate(start) -> for each rollout id k:
        wait for rollout k -> launch generate(k+1) -> train k -> save if due
        -> weight sync every rollout.weight_sync.interval steps (and before an eval, and after the last step):
           wait for generate(k+1) first, so weights never change under a running generation
        -> log -> eval if due

Rollout k+1 thus comes from the weights the engines held before step k trained: one version stale
(staleness k+1 - e per sample, recorded by the rollout manager, slime.rollout.staleness), up to the
interval with longer intervals. A save of step k runs on the rollout manager after the in-flight
generate(k+1) (the manager serves one call at a time) and writes the data source's cursor from before
rollout k+1 drew its prompts: a resume from step k generates rollout k+1 again, from the same prompts,
with the checkpoint's weights. Disaggregated only: validation refuses `cluster.colocate=true`.

The fully async loop (`train.async=full`, slime.config.async_mode), `run_full`:

    push(start) -> start the manager's stream -> for each rollout id k:
        take k's groups from the stream (finished groups, none over train.max_staleness) -> train k
        -> save if due (the stream's buffer and in-flight groups with it) -> weight sync (interrupting generation)
        -> log -> eval if due
    -> stop the stream

`debug.rollout_only` (`run_rollout_only`, conf/debug/rollout_only.yaml): no trainer; every rollout is generated
with the engines' initial weights, rewarded, logged, and evaluated at its interval; nothing trained or saved.

Both loops publish the same phase events (slime.driver.events): the console's progress display
(slime.driver.console), checkpoint bookkeeping and a fault injector (debug.signal_at/hang_at) follow the run
through them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import ray

from slime.config.async_mode import AsyncMode
from slime.config.schema import RunConfig
from slime.driver.events import Event, RunEvent
from slime.driver.run_state import RunState
from slime.driver.train_group import TrainGroup
from slime.driver.weight_push import DueChecks, WeightPush
from slime.rollout.manager.deaths import call_recovering
from slime.rollout.setup import ROLLOUT_CLOCK
from slime.tracking.tracker import Tracker
from slime.train.train_setup import TrainSetup, frozen_checkpoints, needs_old_log_probs

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class RunParts:
    """What a run is made of, once started (slime.driver.driver builds it)."""

    cfg: RunConfig
    state: RunState
    manager: Any  # the RolloutManager actor
    tracker: Tracker
    actor: TrainGroup | None = None  # None: debug.rollout_only
    critic: TrainGroup | None = None  # PPO's value model
    pusher: WeightPush | None = None  # None: no engines hold trained weights (rollout_only, load_rollout_data)
    group_poll_s: float | None = None  # how often a rollout's group counts are fetched while it runs (None: never)


@dataclasses.dataclass
class Step:
    """One rollout step as it goes through the loop: its data and the records it will log."""

    rollout_id: int
    started: float = dataclasses.field(default_factory=time.perf_counter)
    shards: list[ray.ObjectRef] = dataclasses.field(default_factory=list)  # per DP rank, its TrainBatch (by reference)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # the step's record
    preview: list[dict] = dataclasses.field(default_factory=list)  # samples.jsonl's samples
    train_steps: list[dict[str, float]] = dataclasses.field(default_factory=list)  # one record per optimizer step
    restarted: int = 0  # engines restarted (fault tolerance) before this step's rollout


def due(rollout_id: int, interval: int | None) -> bool:
    return interval is not None and (rollout_id + 1) % interval == 0


class RunLoop:
    """The run's parts with one method per step of a rollout; `run()` picks the loop the config asks for.

    Timing metrics: `perf/step_time`, `perf/train_time` (s) and the loop-relative windows `perf/*_at` (s since
    the loop began, the rollout manager's stamps rebased), `perf/save_model_time`, `perf/trainer_idle_time` (s the
    step waited for its rollout data) and `perf/engine_idle_time` (s of the step with no request of the trainer's in
    flight: the step's time minus its rollout's, or under train.async=full the stream's own count); the async loop adds
    `perf/rollout_wait_time` (s the step waited for its rollout), `perf/rollout_overlap_time` (s of its
    generation that ran while the previous step trained) and `perf/sync_wait_time` (s a weight sync waited for
    the in-flight generation)."""

    def __init__(self, parts: RunParts, start: int):
        self.parts, self.cfg, self.state, self.start = parts, parts.cfg, parts.state, start
        self.last = parts.cfg.train.num_rollout - 1
        self.t0 = time.time()
        self.train_window: tuple[float, float] | None = None  # the previous step's (start, end), loop seconds
        self.checks_due = DueChecks()  # the last push's check figures, for the record of the step that trains next
        self.state.events.subscribe(RunEvent.CHECKPOINT_SAVED, self._checkpoint_saved)

    def _checkpoint_saved(self, event: Event) -> None:
        """The run id goes with the checkpoint; plots refreshed (the last save's come with the end of the run)."""
        self.parts.tracker.on_save(self.cfg.checkpoint.save, plot=event.rollout_id < self.last)

    def close(self) -> None:
        """Before the tracker closes: saves no longer go to it."""
        self.state.events.unsubscribe(self._checkpoint_saved)

    def run(self) -> None:
        self.state.events.publish(RunEvent.LOOP_STARTED, start=self.start, trainer=self.parts.actor)
        if self.parts.actor is None:
            self.run_rollout_only()
        elif self.cfg.train.async_mode is AsyncMode.FULL:
            self.run_full()
        elif self.cfg.train.async_mode is AsyncMode.ONE_STEP:
            self.run_async()
        else:
            self.run_sync()

    # ---- the loops -------------------------------------------------------------------------------------------
    def run_sync(self) -> None:
        """The synchronous loop: initial push, eval at 0, then per rollout id: rollout, train, save, sync, log, eval."""
        self.begin()
        for rollout_id in range(self.start, self.last + 1):
            step = self.begin_step(rollout_id)
            step.restarted = self.recover_engines(rollout_id)
            self.rollout_recovering(step)
            self.state.enter("log_probs", rollout_id)
            step.metrics.update(self.before_train(rollout_id))
            self.train(step)
            self.save_if_due(step)
            self.state.enter("weight_sync", rollout_id)
            self.push_weights(step)
            self.finish(step)

    def run_async(self) -> None:
        """The one-step-async loop (the module docstring): rollout k+1 is generated while step k trains."""
        self.begin()
        in_flight = self.generate(self.start) if self.start <= self.last else None
        for rollout_id in range(self.start, self.last + 1):
            step = self.begin_step(rollout_id)
            self.rollout_recovering(step, in_flight)
            self.note_overlap(step)
            in_flight = None
            if rollout_id < self.last:
                # engines that died are restarted and get the current weights before the next rollout starts
                step.restarted += self.recover_engines(rollout_id)
                in_flight = self.generate(rollout_id + 1)
            self.state.enter("log_probs", rollout_id)
            self.train(step)
            self.save_if_due(step)
            self.note_restarts(step)
            if self.async_sync_due(rollout_id):
                self.state.enter("weight_sync", rollout_id)
                self.wait_for_generation(step, in_flight)
                self.push_weights(step)
            self.finish(step)

    def run_full(self) -> None:
        """train.async=full (the module docstring): the engines never wait for training, nor the trainer for a
        whole rollout step; each push interrupts generation."""
        self.begin()
        ray.get(self.parts.manager.start_stream.remote(self.start))
        for rollout_id in range(self.start, self.last + 1):
            step = self.begin_step(rollout_id)
            self.rollout_recovering(step)
            self.state.enter("log_probs", rollout_id)
            self.train(step)
            self.save_if_due(step)
            self.state.enter("weight_sync", rollout_id)
            self.push_weights(step)
            self.finish(step)
        ray.get(self.parts.manager.stop_stream.remote())

    def run_rollout_only(self) -> None:
        """debug.rollout_only: generate, reward, log and evaluate with the engines' initial weights."""
        self.evaluate_if_due_at_start()
        for rollout_id in range(self.start, self.last + 1):
            step = self.begin_step(rollout_id)
            self.receive(step, self.generate(rollout_id))
            self.finish(step)

    # ---- the steps -------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Steps 0-1 of the loop: the engines get the run's weights (version `start`), then eval at 0.

        On a resume (`start` > 0), metrics.jsonl and samples.jsonl are cut back to the checkpoint, and its eval
        runs now when the crash came before it was logged."""
        self.state.enter("weight_sync", self.start - 1)
        if self.parts.pusher is not None:
            self.checks_due.hold(self.parts.pusher.push(weight_version=self.start))  # before rollout 0
            self.state.events.publish(RunEvent.WEIGHTS_PUSHED, self.start - 1)
        if self.start > 0:
            self.parts.tracker.resume(self.cfg.checkpoint.load, self.start)
            if due(self.start - 1, self.cfg.eval.interval) and not self.parts.tracker.has_eval(self.start):
                self.evaluate(self.start)
        else:
            self.evaluate_if_due_at_start()
        self.t0 = time.time()

    def evaluate_if_due_at_start(self) -> None:
        if self.cfg.eval.interval and not self.cfg.eval.skip_eval_before_train:
            self.evaluate(0)

    def begin_step(self, rollout_id: int) -> Step:
        step = Step(rollout_id)
        self.state.enter("rollout", rollout_id)
        return step

    def generate(self, rollout_id: int) -> ray.ObjectRef:
        """Ask the rollout manager for rollout `rollout_id` (its result: a RolloutResult)."""
        self.state.events.publish(RunEvent.ROLLOUT_STARTED, rollout_id)
        return self.parts.manager.generate.remote(rollout_id)

    def recover_engines(self, rollout_id: int) -> int:
        """Fault tolerance: engines that died since the last push restart with the current weights; how many."""
        return self.parts.pusher.recover(weight_version=rollout_id) if self.parts.pusher is not None else 0

    def rollout_recovering(self, step: Step, pending: ray.ObjectRef | None = None) -> None:
        """The step's rollout (`pending`: already asked for, the one-step-async loop's), received. With fault
        tolerance, a rollout the death of an engine or a router cut short (the manager put its data source back
        where the step began) is generated again once what died restarted with the trainer's weights."""

        def attempt(number: int) -> None:
            asked = pending if number == 0 and pending is not None else self.generate(step.rollout_id)
            self.receive(step, asked)

        _, restarted = call_recovering(
            attempt,
            fault_tolerance=self.cfg.rollout.fault_tolerance,
            recover=lambda: self.recover_engines(step.rollout_id),
            redo=f"generating rollout {step.rollout_id}",
        )
        step.restarted += restarted

    def receive(self, step: Step, pending: ray.ObjectRef) -> None:
        """Wait for the step's rollout; meanwhile (every `group_poll_s` s) and once at the end, its group counts are
        published (RunEvent.ROLLOUT_PROGRESS)."""
        poll_s = self.parts.group_poll_s
        waited = time.perf_counter()
        while poll_s is not None and not ray.wait([pending], timeout=poll_s)[0]:
            self._publish_groups(step.rollout_id, final=False)
        step.shards, step.metrics, step.preview = ray.get(pending)  # references to the shards, not the data
        step.metrics["perf/trainer_idle_time"] = time.perf_counter() - waited
        if poll_s is not None:
            self._publish_groups(step.rollout_id, final=True)
        for key in ROLLOUT_CLOCK:  # the manager's time.time() stamps as seconds since the loop began
            if key in step.metrics:
                step.metrics[key] -= self.t0
        self.state.events.publish(RunEvent.ROLLOUT_DONE, step.rollout_id)

    def _publish_groups(self, rollout_id: int, *, final: bool) -> None:
        """The manager answers `progress()` on its own thread (slime.rollout.manager.actor.ACTOR_OPTIONS), never
        queued behind the rollout it reports on; counts of another rollout (the previous one's) are not shown."""
        current, counts = ray.get(self.parts.manager.progress.remote())
        if current == rollout_id:
            self.state.events.publish(RunEvent.ROLLOUT_PROGRESS, rollout_id, counts=counts, final=final)

    def note_overlap(self, step: Step) -> None:
        """Async: how long the step waited for its rollout, and how much of the generation overlapped training."""
        metrics = step.metrics
        metrics["perf/rollout_wait_time"] = metrics["perf/trainer_idle_time"]  # the one-step loop's name for it
        if self.train_window is not None:
            overlap = min(self.train_window[1], metrics["perf/rollout_ended_at"])
            overlap -= max(self.train_window[0], metrics["perf/rollout_started_at"])
            metrics["perf/rollout_overlap_time"] = max(overlap, 0.0)

    def before_train(self, rollout_id: int) -> dict[str, float]:
        """Colocated: the engines' memory goes back to the trainer, which scores the last push's probe (its metrics)."""
        return self.parts.pusher.before_train(rollout_id) if self.parts.pusher is not None else {}

    def train(self, step: Step) -> None:
        """The loop's train step on the training groups, timed: `perf/train_time` (s) and its window
        `perf/train_started_at`/`_ended_at`. The phase moves from log_probs (batch, values, log-probs,
        advantages) to train; `step.train_steps` gets the merged actor (+ critic) `train/*` metrics of every
        optimizer step."""
        metrics, rollout_id = step.metrics, step.rollout_id
        if self.parts.pusher is not None:  # nothing the engines generated on unchecked weights trains
            self.checks_due.land(metrics, self.parts.pusher.await_verification())
        metrics["perf/train_started_at"] = time.time() - self.t0
        actor, critic = self.parts.actor, self.parts.critic
        actor.load_batch(rollout_id, step.shards)
        if critic is not None:  # PPO: the critic's old values feed the actor's GAE
            critic.load_batch(rollout_id, step.shards)
            actor.set_column("values", critic.compute_values())
        for which in frozen_checkpoints(self.cfg):  # the reference model, the distillation teacher
            metrics.update(actor.compute_log_probs(which))
        if needs_old_log_probs(self.cfg.algo, self.cfg.train.num_steps_per_rollout):
            metrics.update(actor.compute_log_probs("old"))
        metrics.update(actor.compute_advantages())
        self.state.enter("train", rollout_id)
        result = actor.train(update=rollout_id >= self.cfg.algo.num_critic_only_steps)
        metrics.update(result["perf"])
        step.train_steps = [dict(s) for s in result["steps"]]
        if critic is not None:  # then the critic learns the actor's returns
            critic.set_column("returns", actor.get_column("returns"))
            critic_result = critic.train()
            metrics.update(critic_result["perf"])
            ours, theirs = step.train_steps, critic_result["steps"]
            step.train_steps = [{**(ours[i] if i < len(ours) else {}), **theirs[i]} for i in range(len(theirs))]
        metrics["perf/train_ended_at"] = time.time() - self.t0
        metrics["perf/train_time"] = metrics["perf/train_ended_at"] - metrics["perf/train_started_at"]
        self.train_window = (metrics["perf/train_started_at"], metrics["perf/train_ended_at"])
        self.state.events.publish(RunEvent.TRAIN_DONE, rollout_id)

    def save_if_due(self, step: Step) -> None:
        """The loop's save step: save every `checkpoint.save_interval` rollouts and at the last one.

        The step's records so far are staged with the checkpoint: a resume logs them if the run dies between
        the save and their logging (slime.tracking.continuity). Every role and the data source are saved, plus
        an HF export where `checkpoint.save_hf` asks for one. The actor goes last: its tracker file, replaced at
        the very end of its save, is what makes the checkpoint the one a resume picks."""
        rollout_id, ckpt = step.rollout_id, self.cfg.checkpoint
        if not (due(rollout_id, ckpt.save_interval) or rollout_id == self.last):
            return
        self.state.enter("save", rollout_id)
        self.parts.tracker.stage_step(ckpt.save, rollout_id, step.train_steps, step.metrics)
        save_start = time.perf_counter()
        ray.get(self.parts.manager.save.remote(rollout_id, ckpt.save))
        self.state.events.publish(RunEvent.CHECKPOINT_DATA_SAVED, rollout_id)
        if self.parts.critic is not None:
            self.parts.critic.save_checkpoint(rollout_id, TrainSetup.for_critic_save_root(self.cfg))
        self.parts.actor.save_checkpoint(rollout_id, ckpt.save)
        if ckpt.save_hf:
            self.parts.actor.save_hf(ckpt.save_hf.format(rollout_id=rollout_id))
        step.metrics["perf/save_model_time"] = time.perf_counter() - save_start
        self.state.events.publish(RunEvent.CHECKPOINT_SAVED, rollout_id)

    def note_restarts(self, step: Step) -> None:
        if self.parts.pusher is not None:  # a push adds the engines it restarted itself
            step.metrics["rollout/engine_restarts"] = float(step.restarted)

    def async_sync_due(self, rollout_id: int) -> bool:
        """Every rollout.weight_sync.interval steps, after the last one, and before each eval (evals see the
        trained weights)."""
        interval = self.cfg.rollout.weight_sync.interval
        return due(rollout_id, interval) or rollout_id == self.last or due(rollout_id, self.cfg.eval.interval)

    def wait_for_generation(self, step: Step, in_flight: ray.ObjectRef | None) -> None:
        """Async: the engines finish rollout k+1 with the weights it started with, before a push."""
        if in_flight is not None:
            wait_start = time.perf_counter()
            ray.wait([in_flight])
            step.metrics["perf/sync_wait_time"] = time.perf_counter() - wait_start

    def push_weights(self, step: Step) -> None:
        """The loop's weight sync: push the weights step `rollout_id` trained (version rollout_id + 1)."""
        if self.parts.pusher is None:
            return
        # the push's check runs beside the next rollout, unless an eval or the run's end comes first
        defer = step.rollout_id < self.last and not due(step.rollout_id, self.cfg.eval.interval)
        pushed = self.parts.pusher.sync(weight_version=step.rollout_id + 1, defer=defer)
        self.checks_due.hold(pushed)
        step.metrics.update(pushed)
        if step.rollout_id == self.last:  # no step follows: its record holds them
            self.checks_due.land(step.metrics, {})
        step.metrics["rollout/engine_restarts"] += step.restarted
        self.state.events.publish(RunEvent.WEIGHTS_PUSHED, step.rollout_id)

    def finish(self, step: Step) -> None:
        """Log the step (its optimizer steps, its metrics, sample previews), then eval when due."""
        rollout_id, metrics, tracker = step.rollout_id, step.metrics, self.parts.tracker
        metrics["perf/step_time"] = time.perf_counter() - step.started
        if "perf/engine_idle_time" not in metrics and "perf/rollout_time" in metrics:  # the stream measures its own
            metrics["perf/engine_idle_time"] = max(metrics["perf/step_time"] - metrics["perf/rollout_time"], 0.0)
        tracker.log_step(rollout_id, step.train_steps, metrics)
        if step.train_steps:
            metrics.update(step.train_steps[-1])
        tracker.log_samples(rollout_id, step.preview)
        self.state.events.publish(RunEvent.STEP_DONE, rollout_id, metrics=metrics)
        if due(rollout_id, self.cfg.eval.interval):
            self.evaluate(rollout_id + 1)
        self.state.rollouts_completed += 1
        self.state.last_metrics = metrics

    def evaluate(self, eval_step: int) -> None:
        """Eval with the weights of `eval_step` rollouts trained (phase eval of rollout eval_step - 1)."""
        self.state.enter("eval", eval_step - 1)
        self.state.last_eval, _ = call_recovering(  # a restarted engine gets the weights of eval_step trained steps
            lambda _: ray.get(self.parts.manager.evaluate.remote(eval_step)),
            fault_tolerance=self.cfg.rollout.fault_tolerance,
            recover=lambda: self.recover_engines(eval_step),
            redo=f"evaluating rollout {eval_step}",
        )
        self.parts.tracker.log(self.state.last_eval, eval=eval_step)
        self.state.events.publish(RunEvent.EVAL_DONE, eval_step - 1, metrics=self.state.last_eval)
