"""debug=rollout_only: the rollout side alone, for tuning engines (conf/debug/rollout_only.yaml).

No trainer is built and no weights are pushed: the engines serve `model.hf_checkpoint` as they loaded
it, every rollout is generated and rewarded, its rollout metrics and samples are logged (with
`debug.save_rollout_data`, its samples dumped for debug=train_only), eval runs at its interval; nothing
is trained or saved. (debug=train_only is the driver's replay of `debug.load_rollout_data`: no engines.)
"""

from __future__ import annotations

import time

import ray

from slime.config.schema import RunConfig
from slime.tracking.tracker import Tracker


def rollout_only(cfg: RunConfig, state, manager, engines_ready, tracker: Tracker) -> None:
    """Generate `train.num_rollout` rollouts with the initial weights; `state` is the driver's RunState."""
    state.on_enter = tracker.progress.on_phase
    tracker.progress.begin(0)
    ray.get(engines_ready)
    interval = cfg.eval.interval
    if interval and not cfg.eval.skip_eval_before_train:
        _evaluate(state, manager, tracker, 0)
    for rollout_id in range(cfg.train.num_rollout):
        step_start = time.perf_counter()
        state.enter("rollout", rollout_id)
        _, metrics, preview = ray.get(manager.generate.remote(rollout_id))
        metrics["perf/step_time"] = time.perf_counter() - step_start
        tracker.log(metrics, rollout=rollout_id)
        tracker.log_samples(rollout_id, preview)
        tracker.progress.step_done(rollout_id, metrics)
        if interval and (rollout_id + 1) % interval == 0:
            _evaluate(state, manager, tracker, rollout_id + 1)
        state.rollouts_completed += 1
        state.last_metrics = metrics


def _evaluate(state, manager, tracker: Tracker, eval_step: int) -> None:
    state.enter("eval", eval_step - 1)
    state.last_eval = ray.get(manager.evaluate.remote(eval_step))
    tracker.log(state.last_eval, eval=eval_step)
