"""The rollout manager: one CPU actor owning the router, the engines, the data sources and rewards.

It runs the configured rollout function, post-processes rewards (group normalisation, REFERENCE.md
§3.1) and returns the step's samples already split into one `TrainBatch` per data-parallel rank. It
also brackets weight updates (pause -> flush -> update -> continue) on every engine.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from pathlib import Path
from typing import Any

import ray

from slime.config.derive import Derived
from slime.config.hooks import load_callable
from slime.config.schema import AlgoConfig, DataConfig, EvalConfig, RolloutConfig, RunConfig
from slime.engine.groups import engine_specs, model_specs
from slime.rollout.data_source import DataSource, PromptDataset
from slime.rollout.default import RolloutContext
from slime.runtime.engine_fleet import EngineFleet, FleetSetup
from slime.runtime.placement import EnginePlacement
from slime.types import SampleStatus, TrainBatch

logger = logging.getLogger(__name__)

MAX_FILTER_DROPS_PER_GROUP = 10  # a filter may reject this many groups per kept group before everything is kept
EVAL_SEED_OFFSET = 1_000_003  # eval requests draw from their own seed stream (rollout.deterministic)
_CONTROL_CALLS = {
    "flush_cache",
    "pause_generation",
    "continue_generation",
    "abort_and_wait_idle",
    "release_memory",
    "resume_memory",
}


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
    fleet: FleetSetup  # the served models, one spec per engine, external engines, fault tolerance

    @classmethod
    def from_run_config(cls, cfg: RunConfig, derived: Derived) -> RolloutSetup:
        return cls(
            rollout=cfg.rollout,
            data=cfg.data,
            eval=cfg.eval,
            algo=cfg.algo,
            model_path=cfg.model.hf_checkpoint,
            host=cfg.cluster.host,
            device=cfg.cluster.device,
            colocate=cfg.cluster.colocate,
            seed=cfg.seed,
            log_dir=cfg.paths.output_dir,
            dp_size=derived.dp_size,
            global_batch_size=derived.global_batch_size,
            num_steps_per_rollout=cfg.train.num_steps_per_rollout,
            fleet=FleetSetup(
                rollout=cfg.rollout,
                models=model_specs(cfg),
                specs=engine_specs(cfg, derived.rollout_gpus),
                host=cfg.cluster.host,
                device=cfg.cluster.device,
                colocate=cfg.cluster.colocate,
                seed=cfg.seed,
                run_dir=cfg.paths.output_dir,
                trainer_gpus=derived.actor_gpus,
            ),
        )


class RolloutManager:
    """Created at once; `start()` brings up the engines, the routers and the data sources.

    torch (with transformers, ~2 CPU-seconds) is imported only after the engines were launched, so that
    neither the driver nor this actor's start-up waits for it. The engines, routers and engine control
    calls live in `EngineFleet`; the loop reaches them through this actor's methods.
    """

    def __init__(self, setup: RolloutSetup, engine_placements: list[EnginePlacement]):
        self.setup = setup
        self.fleet = EngineFleet(setup.fleet, engine_placements)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Start every engine, then launch (or join) the routers and load the data while their servers come
        up; register each engine once healthy. Returns the policy's router URL."""
        launched = self.fleet.launch()
        self.fleet.start_routers()
        self._load_data()
        ray.get(launched)
        self.fleet.finish_start()
        if self.setup.colocate:  # the trainer builds next: engines give their memory back until the first push
            self.fleet.release_memory()
        return self.fleet.router_url()

    def _load_data(self) -> None:
        """Tokenizer, prompt datasets, the rollout function and the dynamic filter (a bad data config fails here)."""
        from transformers import AutoTokenizer

        s, r, d = self.setup, self.setup.rollout, self.setup.data
        self.tokenizer = AutoTokenizer.from_pretrained(s.model_path)
        self.data_source = self._prompt_source(d.prompt_data, r.n_samples_per_prompt, shuffle=d.shuffle)
        self.eval_source = None
        if s.eval.interval:
            self.eval_source = self._prompt_source(s.eval.prompt_data, s.eval.n_samples_per_prompt, shuffle=False)
        # validation resolved rollout.function (a registry name, a path or null) to an import path
        self.rollout_fn = load_callable(r.function, key="rollout.function")
        self.dynamic_filter = (
            load_callable(s.algo.dynamic_filter, key="algo.dynamic_filter") if s.algo.dynamic_filter else None
        )

    def _prompt_source(self, path: str, n_samples_per_prompt: int, *, shuffle: bool) -> DataSource:
        """A data source over the prompt file at `path`, read with `data`'s keys and templating."""
        d = self.setup.data
        dataset = PromptDataset(
            path,
            tokenizer=self.tokenizer,
            input_key=d.input_key,
            label_key=d.label_key,
            metadata_key=d.metadata_key,
            apply_chat_template=d.apply_chat_template,
        )
        return DataSource(
            dataset, n_samples_per_prompt=n_samples_per_prompt, shuffle=shuffle, seed=self.setup.rollout.seed
        )

    def urls(self) -> list[str]:
        """The URL of every engine that receives weight syncs, in engine rank order, then external engines."""
        return self.fleet.sync_urls()

    def tensor_handle_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Per synced engine, the training rank on each TP rank's device (tensor mode, colocated)."""
        return self.fleet.tensor_handle_ranks()

    def engine_control(self, call: str, *args: Any) -> None:
        """Run one of the fleet's control calls on the engines: flush_cache, pause_generation,
        continue_generation, abort_and_wait_idle, release_memory, resume_memory(tags)."""
        if call not in _CONTROL_CALLS:
            raise ValueError(f"unknown engine control call {call!r}; one of {sorted(_CONTROL_CALLS)}")
        getattr(self.fleet, call)(*args)

    def recover_engines(self) -> list[int]:
        """Restart engines the health checks found dead (they get weights next); returns their ranks."""
        return self.fleet.recover()

    def register_engines(self, ranks: list[int]) -> None:
        self.fleet.register_restarted(ranks)

    def shutdown(self) -> None:
        self.fleet.shutdown()

    # ---- rollout -----------------------------------------------------------------------------
    def _context(self, *, evaluation: bool) -> RolloutContext:
        r, e = self.setup.rollout, self.setup.eval
        source = self.eval_source if evaluation else self.data_source
        max_new = e.max_response_len if evaluation else r.max_response_len
        sampling = {
            "temperature": e.temperature if evaluation else r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "max_new_tokens": max_new,
            "stop": list(r.stop),
            "stop_token_ids": list(r.stop_token_ids),
            "skip_special_tokens": r.skip_special_tokens,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
        batch = len(source.dataset) if evaluation else r.batch_size
        return RolloutContext(
            router_url=self.fleet.router_url(),
            model_routers=self.fleet.model_routers(),
            request_timeout_s=r.request_timeout_s,
            tokenizer=self.tokenizer,
            data_source=source,
            batch_size=batch,
            over_sampling_batch_size=batch if evaluation else r.over_sampling_batch_size,
            sampling_params=sampling,
            max_in_flight=r.concurrency * max(self.fleet.num_generating_engines(), 1),
            rm_type=r.rm_type,
            custom_rm_path=r.custom_rm_path,
            dynamic_filter=None if evaluation else self.dynamic_filter,
            max_filter_drops=MAX_FILTER_DROPS_PER_GROUP * batch,
            sampling_seed=self._sampling_seed(evaluation),
        )

    def _sampling_seed(self, evaluation: bool) -> int | None:
        if not self.setup.rollout.deterministic:
            return None
        return self.setup.seed + (EVAL_SEED_OFFSET if evaluation else 0)

    def generate(self, rollout_id: int) -> tuple[list[TrainBatch], dict[str, float], list[dict]]:
        """One training rollout step: (per-DP-rank batches, rollout metrics, a few samples for the log)."""
        import torch

        from slime.rollout.postprocess import (
            overlong_penalty,
            post_process_rewards,
            rollout_metrics,
            split_for_data_parallel,
        )

        out = self.rollout_fn(self._context(evaluation=False), rollout_id, evaluation=False)
        self.fleet.abort_and_wait_idle()  # nothing a custom rollout function left running outlives its step
        groups = out.groups
        if len(groups) != self.setup.rollout.batch_size:
            raise RuntimeError(
                f"the rollout function returned {len(groups)} groups, expected rollout.batch_size="
                f"{self.setup.rollout.batch_size}"
            )
        samples = [s for g in groups for s in g]
        if len({s.index for s in samples}) != len(samples):  # a retried request must replace, never add
            raise RuntimeError(f"rollout {rollout_id}: a sample index appears twice in the rollout function's groups")
        a = self.setup.algo
        raw = torch.tensor([s.scalar_reward(self.setup.rollout.reward_key) for s in samples], dtype=torch.float64)
        metrics = {**out.metrics, **rollout_metrics(groups, raw, self.setup.rollout.n_samples_per_prompt)}
        shaped = raw
        if a.overlong_buffer_len:
            penalty = torch.tensor(
                overlong_penalty(
                    [s.response_length for s in samples],
                    max_response_len=self.setup.rollout.max_response_len,
                    buffer_len=a.overlong_buffer_len,
                    factor=a.overlong_penalty_factor,
                ),
                dtype=torch.float64,
            )
            shaped = raw + penalty
            metrics["rollout/overlong_penalty"] = float(penalty.mean())
        rewards = post_process_rewards(shaped, a, self.setup.rollout.n_samples_per_prompt)
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
        )
        return batches, metrics, preview

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Mean reward, truncation ratio and pass@k over the eval prompts (`eval/<name>...`)."""
        from slime.algo import pass_at_k

        if self.eval_source is None:
            return {}
        self.eval_source.sample_offset, self.eval_source.epoch_id = 0, 0
        out = self.rollout_fn(self._context(evaluation=True), rollout_id, evaluation=True)
        name, n = self.setup.eval.name, self.setup.eval.n_samples_per_prompt
        samples = [s for g in out.groups for s in g]
        rewards = [s.scalar_reward(self.setup.rollout.reward_key) for s in samples]
        metrics = {
            f"eval/{name}": statistics.fmean(rewards),
            f"eval/{name}-truncated_ratio": statistics.fmean(s.status == SampleStatus.TRUNCATED for s in samples),
        }
        k = 1
        while k <= n:
            metrics[f"eval/{name}-pass@{k}"] = statistics.fmean(
                pass_at_k(n, sum(s.reward == 1 for s in g), k) for g in out.groups
            )
            k *= 2
        return metrics

    # ---- weights and state -------------------------------------------------------------------
    def save(self, rollout_id: int, root: str) -> None:
        import torch

        target = Path(root) / "rollout"
        target.mkdir(parents=True, exist_ok=True)
        torch.save(self.data_source.state_dict(), target / f"global_dataset_state_dict_{rollout_id}.pt")

    def load(self, rollout_id: int, root: str) -> None:
        import torch

        path = Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint.load={root}: no data-source state {path}")
        self.data_source.load_state_dict(torch.load(path, weights_only=False))
