"""The rollout manager's configuration: its typed sub-config and the run-level numbers it needs (the driver builds
it: slime.driver.rollout_setup), and the keys of a rollout's wall-clock window in its metrics."""

from __future__ import annotations

import dataclasses

from slime.config.schema import AlgoConfig, DataConfig, EvalConfig, RolloutConfig
from slime.engine.fleet_setup import FleetSetup
from slime.rollout.base import StreamLimits

# a rollout's wall-clock window (time.time(), s), in its metrics; the driver rebases them to its loop's start
ROLLOUT_CLOCK = ("perf/rollout_started_at", "perf/rollout_ended_at")


@dataclasses.dataclass(kw_only=True)
class RolloutSetup:
    """The rollout manager's typed sub-config and the run-level numbers it needs."""

    rollout: RolloutConfig
    data: DataConfig
    eval: EvalConfig
    algo: AlgoConfig
    model_path: str
    host: str
    device: str
    colocate: bool  # engines share the trainer's GPUs (fractional actors)
    seed: int
    log_dir: str
    dp_size: int
    global_batch_size: int  # G
    num_steps_per_rollout: int  # K
    balance_tokens: bool  # deal samples to DP ranks by token count (micro-batches by tokens)
    fleet: FleetSetup  # the served models, one spec per engine, external engines, fault tolerance
    save_rollout_data: bool = False  # debug: dump each step's samples to <log_dir>/rollout_data/
    check_weight_update_equal: bool = False  # debug: engines snapshot and randomise their weights once up
    load_rollout_data: str | None = None  # debug: train from these dumps; no router, no engines
    max_train_groups: int | None = None  # train.num_epoch sizes the run: fresh groups it trains (num_rollout × batch)
    stream: StreamLimits | None = None  # train.async=full: groups generated continuously (slime.rollout.stream)
