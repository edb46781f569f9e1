"""The rollout manager: one CPU actor owning the router, the engines, the data sources and rewards.

It runs the configured rollout function, post-processes rewards (group normalisation, REFERENCE.md
§3.1) and splits the step's samples into one `TrainBatch` per data-parallel rank, which it puts into Ray's
object store itself: the driver receives one reference per shard (plus the step's metrics and a few samples
for the log) and hands each reference to the ranks of its shard, which read it from the store (never
through the driver, slime.runtime.train_group). The driver's weight pushes (weight_push.py) run its engine control calls, and tell it when a push begins and
ends: the engines' health checks rest in between (engine_health.py).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

import ray

from slime.config.hooks import load_callable
from slime.rollout.base import (
    EvalDataset,
    RolloutContext,
    RolloutHooks,
    RolloutOutput,
    RolloutProgress,
    as_eval_output,
    as_rollout_output,
)
from slime.rollout.data_source import DataSourceBase, build_data_source
from slime.rollout.dumps import load_rollout_data, save_rollout_data
from slime.rollout.entry_points import ROLLOUT_FN_SHAPE, function_path
from slime.rollout.eval_metrics import eval_metrics
from slime.rollout.rewards import RewardHub, check_failures
from slime.rollout.staleness import record_staleness
from slime.runtime.engine_fleet import EngineFleet
from slime.runtime.placement import EnginePlacement
from slime.runtime.rollout_setup import RolloutSetup
from slime.runtime.watchdog import arm_stack_dump
from slime.types import SampleStatus, TrainBatch

logger = logging.getLogger(__name__)
_CONTROL_CALLS = {
    "flush_cache",
    "pause_generation",
    "continue_generation",
    "abort_and_wait_idle",
    "release_memory",
    "resume_memory",
    "begin_push",
    "end_push",
}

# The manager's `ray.remote` options (Ray takes concurrency groups there, not in .options()): `progress`
# answers on its own thread while `generate` runs; every other method stays on the one default thread.
ACTOR_OPTIONS = {"num_cpus": 0, "concurrency_groups": {"progress": 1}}
MAX_FILTER_DROPS_PER_GROUP = 10  # a filter may reject this many groups per kept group before everything is kept
EVAL_SEED_OFFSET = 1_000_003  # eval requests draw from their own seed stream (rollout.deterministic)
# generate()'s wall-clock window (time.time(), s); the driver rebases them to its loop's start
ROLLOUT_CLOCK = ("perf/rollout_started_at", "perf/rollout_ended_at")


class RolloutResult(NamedTuple):
    """One train rollout as the driver receives it: small, the training data stays in Ray's object store."""

    shards: list[ray.ObjectRef]  # per data-parallel rank, in rank order: a reference to its TrainBatch
    metrics: dict[str, float]  # the step's rollout-side metrics (`rollout/*`, `perf/*`)
    preview: list[dict]  # a few samples as dicts (Sample.to_dict() + rollout_step), for the sample log


def sampling_params(node, rollout) -> dict[str, Any]:
    """SGLang sampling params from `node` (the rollout config or an eval dataset), the rest from `rollout`.

    Each survives sglang-router 0.3.2 (tests/engine/test_router_contract.py): `spaces_between_special_tokens`
    is not sent, as the router drops it (slime.engine.router.DROPPED_SAMPLING_PARAMS); engines use SGLang's
    default, which fast tokenizers ignore when decoding."""
    return {
        "temperature": node.temperature,
        "top_p": node.top_p,
        "top_k": node.top_k,
        "max_new_tokens": node.max_response_len,
        "stop": list(rollout.stop),
        "stop_token_ids": list(rollout.stop_token_ids),
        "skip_special_tokens": rollout.skip_special_tokens,
        "no_stop_trim": True,
    }


class RolloutManager:
    """Created at once; `start()` brings up the engines, the router and the data sources.

    torch (with transformers, ~2 CPU-seconds) is imported only after the engines were launched, so that
    neither the driver nor this actor's start-up waits for it.
    """

    def __init__(self, setup: RolloutSetup, engine_placements: list[EnginePlacement]):
        arm_stack_dump()  # the watchdog's stack dump (slime.runtime.watchdog)
        self.setup = setup
        self.fleet = EngineFleet(setup.fleet, engine_placements)
        self.rewards: RewardHub | None = None  # built with the data (remote_rm's session lives in it)
        self.rollout_progress: tuple[int, RolloutProgress] = (-1, RolloutProgress())  # (rollout id, its counts)
        # (rollout id, the data source's state before that rollout drew): a save of the rollout before it writes
        # this state, so the one-step-async loop's in-flight rollout is drawn again on resume (never skipped)
        self._cursor_before: tuple[int, dict[str, Any]] | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Start every engine, then launch (or join) the router and load the data while their servers come
        up; register each engine once healthy. Returns the router URL."""
        r, s = self.setup.rollout, self.setup
        if s.load_rollout_data is not None:  # replaying dumps: nothing to generate with
            self.data_source, self.eval_sources, self.tokenizer = None, {}, None
            self.hooks = RolloutHooks.load(r, s.algo)  # reward_post_process still applies
            return ""
        launched = self.fleet.launch()
        self.fleet.start_routers()
        self._load_data()
        ray.get(launched)
        self.fleet.finish_start()
        if s.check_weight_update_equal:  # before a colocated engine releases (and loses) the checkpoint's weights
            self.fleet.prepare_weight_check()
        if s.colocate:  # the trainer builds next: engines give their memory back until the first push
            self.fleet.release_memory()
        return self.fleet.router_url()

    def _load_data(self) -> None:
        """Tokenizer, prompt datasets (train and eval), the rollout functions and hooks (a bad data config fails here)."""
        # transformers: as torch below, loaded in the actor only (the driver imports this module)
        from transformers import AutoTokenizer

        s, r, d = self.setup, self.setup.rollout, self.setup.data
        self.tokenizer = AutoTokenizer.from_pretrained(s.model_path)
        self.data_source = self._prompt_source(
            d.prompt_data, r.n_samples_per_prompt, shuffle=d.shuffle, max_groups=s.max_train_groups
        )
        self.rewards = RewardHub.from_config(r)
        self.eval_sources = {}
        if s.eval.interval:
            for name, e in s.eval.datasets.items():
                keys = dict(input_key=e.input_key, label_key=e.label_key, metadata_key=e.metadata_key)
                self.eval_sources[name] = self._prompt_source(e.prompt_data, e.n_samples_per_prompt, **keys)
        # validation resolved rollout.function (a registry name, a path or null) to an import path
        self.rollout_fn = load_callable(r.function, key="rollout.function", **ROLLOUT_FN_SHAPE)
        self.eval_fn = self.rollout_fn
        if s.eval.function is not None:
            self.eval_fn = load_callable(function_path(s.eval.function), key="eval.function", **ROLLOUT_FN_SHAPE)
        self.hooks = RolloutHooks.load(r, s.algo)

    def _prompt_source(
        self,
        path: str,
        n_samples_per_prompt: int,
        *,
        shuffle: bool = False,
        max_groups: int | None = None,
        **keys: str | None,
    ) -> DataSourceBase:
        """A data source over the prompt file at `path`, read with `data`'s keys (or `keys`) and templating; the
        class is `data.source_class` when set; `max_groups` bounds its fresh groups (train.num_epoch)."""
        return build_data_source(
            dataclasses.replace(self.setup.data, **keys),
            path,
            tokenizer=self.tokenizer,
            n_samples_per_prompt=n_samples_per_prompt,
            shuffle=shuffle,
            max_prompt_len=self.setup.rollout.max_prompt_len,
            max_groups=max_groups,
        )

    def urls(self) -> list[str]:
        """The URL of every engine that receives weight syncs, in engine rank order, then external engines."""
        return self.fleet.sync_urls()

    def tensor_handle_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Per synced engine, the training rank on each TP rank's device (tensor mode, colocated)."""
        return self.fleet.tensor_handle_ranks()

    def engine_control(self, call: str, *args: Any) -> None:
        """Run one of the fleet's control calls on the engines: flush_cache, pause_generation,
        continue_generation, abort_and_wait_idle, release_memory, resume_memory(tags); begin_push and end_push
        bracket a weight push (no health probe in between)."""
        if call not in _CONTROL_CALLS:
            raise ValueError(f"unknown engine control call {call!r}; one of {sorted(_CONTROL_CALLS)}")
        getattr(self.fleet, call)(*args)

    def dead_engines(self) -> list[int]:
        """Ranks of the engines the health checks found dead or whose server process has exited."""
        return self.fleet.find_dead()

    def recover_engines(self) -> list[int]:
        """Restart dead engines (they get weights next; colocated, they release their memory first); returns
        their ranks."""
        return self.fleet.recover()

    def register_engines(self, ranks: list[int]) -> None:
        self.fleet.register_restarted(ranks)

    def shutdown(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        self.fleet.shutdown()

    # ---- rollout -----------------------------------------------------------------------------
    def _context(self, *, evaluation: bool) -> RolloutContext:
        s, r = self.setup, self.setup.rollout
        batch = r.batch_size
        return RolloutContext(
            config=r,
            router_url=self.fleet.router_url() if s.load_rollout_data is None else "",  # none when replaying dumps
            model_routers=self.fleet.model_routers() if s.load_rollout_data is None else {},
            request_timeout_s=r.request_timeout_s,
            tokenizer=self.tokenizer,
            batch_size=batch,
            over_sampling_batch_size=r.over_sampling_batch_size,
            sampling_params=self._sampling_params(r),
            max_in_flight=r.concurrency * max(self.fleet.num_generating_engines(), 1),
            rewards=self.rewards,
            reward_key=r.reward_key,
            hooks=self.hooks,
            max_filter_drops=MAX_FILTER_DROPS_PER_GROUP * batch,
            sampling_seed=self._sampling_seed(evaluation),
            eval_datasets=self._eval_datasets() if evaluation else [],
        )

    def _sampling_params(self, node) -> dict[str, Any]:
        return sampling_params(node, self.setup.rollout)

    def _eval_datasets(self) -> list[EvalDataset]:
        """Every eval dataset from its first prompt (its source rewound), with its own settings."""
        datasets = []
        for name, e in self.setup.eval.datasets.items():
            source = self.eval_sources[name]
            source.sample_offset, source.epoch_id = 0, 0
            datasets.append(
                EvalDataset(
                    name=name,
                    source=source,
                    num_prompts=len(source),
                    n_samples_per_prompt=e.n_samples_per_prompt,
                    sampling_params=self._sampling_params(e),
                    rm_type=e.rm_type,
                    reward_key=e.reward_key,
                )
            )
        return datasets

    def _sampling_seed(self, evaluation: bool) -> int | None:
        if not self.setup.rollout.deterministic:
            return None
        return self.setup.seed + (EVAL_SEED_OFFSET if evaluation else 0)

    def generate(self, rollout_id: int) -> RolloutResult:
        """One training rollout step (`rollout_step`) with its shards put into Ray's object store: this actor
        owns them, each shard's ranks read them there."""
        batches, metrics, preview = self.rollout_step(rollout_id)
        return RolloutResult([ray.put(batch) for batch in batches], metrics, preview)

    def rollout_step(self, rollout_id: int) -> tuple[list[TrainBatch], dict[str, float], list[dict]]:
        """One training rollout step: (per-DP-rank batches, rollout metrics, a few samples for the log).

        Each sample's staleness is taken against trainer weight version `rollout_id` (rollout/staleness.py)."""
        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        from slime.rollout.postprocess import rollout_metrics, split_for_data_parallel

        started = time.time()
        if self.data_source is not None:
            self._cursor_before = (rollout_id, copy.deepcopy(self.data_source.state_dict()))
        ctx = self._context(evaluation=False)
        self.rollout_progress = (rollout_id, ctx.progress)
        out = self._rollout(ctx, rollout_id)
        groups = out.groups
        if len(groups) != self.setup.rollout.batch_size:
            raise RuntimeError(
                f"the rollout function returned {len(groups)} groups, expected rollout.batch_size="
                f"{self.setup.rollout.batch_size}"
            )
        samples = [s for g in groups for s in g]
        if len({s.index for s in samples}) != len(samples):  # a retried request must replace, never add
            raise RuntimeError(f"rollout {rollout_id}: a sample index appears twice in the rollout function's groups")
        staleness = record_staleness(samples, trainer_version=rollout_id)
        if self.setup.save_rollout_data:
            save_rollout_data(self.setup.log_dir, rollout_id, groups)
        failures = check_failures(samples, self.setup.rollout.reward.max_failure_ratio)
        raw, rewards, shaping = self._rewards(ctx, samples)
        metrics = {
            **out.metrics,
            **failures,
            **rollout_metrics(groups, raw, self.setup.rollout.n_samples_per_prompt),
            **shaping,
            **staleness,
        }
        metrics["rollout/rewards"] = float(rewards.mean())
        metrics["rollout/num_prompts"] = float(len({s.group_index for s in samples}))
        metrics["rollout/num_aborted"] = float(sum(s.status == SampleStatus.ABORTED for s in samples))
        preview = [
            dict(s.to_dict(), rollout_step=rollout_id)
            for s in samples[: max(self.setup.rollout.n_samples_per_prompt, 4)]
        ]
        s = self.setup
        batches = split_for_data_parallel(
            samples,
            raw.tolist(),
            rewards.tolist(),
            global_batch_size=s.global_batch_size,
            num_steps=s.num_steps_per_rollout,
            dp_size=s.dp_size,
            balance_tokens=s.balance_tokens,
        )
        metrics.update(zip(ROLLOUT_CLOCK, (started, time.time())))
        return batches, metrics, preview

    @ray.method(concurrency_group="progress")
    def progress(self) -> tuple[int, dict[str, int]]:
        """(rollout id, its group counts so far: RolloutProgress fields) of the latest train rollout."""
        rollout_id, counts = self.rollout_progress
        return rollout_id, dataclasses.asdict(counts)

    def _rollout(self, ctx: RolloutContext, rollout_id: int) -> RolloutOutput:
        """The rollout function's step, or the step's dump under debug.load_rollout_data."""
        if self.setup.load_rollout_data is None:
            if self.hooks.buffer_filter is not None:
                self.data_source.buffer_filter = functools.partial(self.hooks.buffer_filter, ctx, rollout_id)
            out = self.rollout_fn(ctx, rollout_id, self.data_source, evaluation=False)
            self.fleet.abort_and_wait_idle()  # nothing a custom rollout function left running outlives its step
            return as_rollout_output(out, "rollout.function")
        start = time.perf_counter()
        groups = load_rollout_data(self.setup.load_rollout_data, rollout_id)
        return RolloutOutput(groups=groups, metrics={"perf/rollout_time": time.perf_counter() - start})

    def _rewards(self, ctx: RolloutContext, samples: list) -> tuple[Any, Any, dict[str, float]]:
        """(raw rewards, post-processed rewards, metrics) as float64 tensors: the hook's, or the algorithm's."""
        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        import torch

        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        from slime.rollout.postprocess import overlong_penalty, post_process_rewards

        if self.hooks.reward_post_process is not None:
            raw, rewards = self.hooks.reward_post_process(ctx, samples)
            return torch.as_tensor(raw, dtype=torch.float64), torch.as_tensor(rewards, dtype=torch.float64), {}
        a, r = self.setup.algo, self.setup.rollout
        raw = torch.tensor([s.scalar_reward(r.reward_key) for s in samples], dtype=torch.float64)
        shaped, metrics = raw, {}
        if a.overlong_buffer_len:
            lengths = [s.response_length for s in samples]
            penalty = overlong_penalty(
                lengths,
                max_response_len=r.max_response_len,
                buffer_len=a.overlong_buffer_len,
                factor=a.overlong_penalty_factor,
            )
            shaped = raw + torch.tensor(penalty, dtype=torch.float64)
            metrics["rollout/overlong_penalty"] = float(statistics.fmean(penalty))
        return raw, post_process_rewards(shaped, a, r.n_samples_per_prompt), metrics

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Per eval dataset: mean reward, truncation ratio, response length and pass@k (`eval/<name>...`)."""
        if not self.eval_sources:
            return {}
        ctx = self._context(evaluation=True)
        out = as_eval_output(self.eval_fn(ctx, rollout_id, self.data_source, evaluation=True), "eval.function")
        metrics = dict(out.metrics)
        for dataset in ctx.eval_datasets:
            if dataset.name not in out.datasets:
                raise RuntimeError(f"the eval function returned no groups for eval dataset {dataset.name!r}")
            metrics.update(eval_metrics(dataset.name, out.datasets[dataset.name], dataset.reward_key))
        return metrics

    # ---- weights and state -------------------------------------------------------------------
    def save(self, rollout_id: int, root: str) -> None:
        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        import torch

        if self.data_source is None:  # replaying dumps: no data source
            return
        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        from slime.train.rng import rng_state

        directory = Path(root) / "rollout"
        directory.mkdir(parents=True, exist_ok=True)
        # this actor's generators (user hooks may draw from them), then the data source's cursor and buffer; the
        # one-step-async loop's in-flight rollout drew ahead: its cursor before that draw is saved instead
        drawn_ahead = self._cursor_before is not None and self._cursor_before[0] == rollout_id + 1
        states = {
            f"rng_{rollout_id}.pt": rng_state(),
            f"global_dataset_state_dict_{rollout_id}.pt": self._cursor_before[1]
            if drawn_ahead
            else self.data_source.state_dict(),
        }
        for name, state in states.items():
            partial = directory / f"{name}.partial"  # renamed once complete: a killed save leaves no .pt
            torch.save(state, partial)
            partial.replace(directory / name)

    def load(self, rollout_id: int, root: str) -> None:
        # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
        import torch

        if self.data_source is None:
            return
        path = Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint.load={root}: no data-source state {path}")
        # weights_only: tensors and plain containers only, nothing a checkpoint file could execute
        self.data_source.load_state_dict(torch.load(path, weights_only=True))
        rng = path.with_name(f"rng_{rollout_id}.pt")
        if rng.exists():  # absent from checkpoints of earlier versions
            # torch: the driver imports this module to define the Ray actor and never loads torch; the actor does
            from slime.train.rng import set_rng_state

            set_rng_state(torch.load(rng, weights_only=True))
