"""The rollout manager: one CPU actor owning the router, the engines, the data sources and rewards.

It runs the configured rollout function, post-processes rewards (group normalisation, REFERENCE.md
§3.1) and returns the step's samples already split into one `TrainBatch` per data-parallel rank. It
also brackets weight updates (pause -> flush -> update -> continue) on every engine.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import ray

from slime.config.derive import Derived
from slime.config.hooks import load_callable
from slime.config.schema import AlgoConfig, DataConfig, EvalConfig, RolloutConfig, RunConfig
from slime.engine.base import EngineLaunch, get_engine_class
from slime.engine.router import Router
from slime.rollout.data_source import DataSourceBase, build_data_source
from slime.rollout.default import RolloutContext, RolloutOutput
from slime.rollout.dumps import load_rollout_data, save_rollout_data
from slime.rollout.rewards import RewardHub, check_failures
from slime.runtime.placement import EnginePlacement
from slime.runtime.watchdog import arm_stack_dump
from slime.types import SampleStatus, TrainBatch

logger = logging.getLogger(__name__)

MAX_FILTER_DROPS_PER_GROUP = 10  # a filter may reject this many groups per kept group before everything is kept
EVAL_SEED_OFFSET = 1_000_003  # eval requests draw from their own seed stream (rollout.deterministic)


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
    save_rollout_data: bool = False  # debug: dump each step's samples to <log_dir>/rollout_data/
    load_rollout_data: str | None = None  # debug: train from these dumps; no router, no engines

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
            balance_tokens=cfg.parallelism.max_tokens_per_gpu is not None,
            save_rollout_data=cfg.debug.save_rollout_data,
            load_rollout_data=(
                str(Path(cfg.debug.load_rollout_data).resolve()) if cfg.debug.load_rollout_data else None
            ),
        )


class RolloutManager:
    """Created at once; `start()` brings up the engines, the router and the data sources.

    torch (with transformers, ~2 CPU-seconds) is imported only after the engines were launched, so that
    neither the driver nor this actor's start-up waits for it.
    """

    def __init__(self, setup: RolloutSetup, engine_placements: list[EnginePlacement]):
        arm_stack_dump()  # the watchdog's stack dump (slime.runtime.watchdog)
        self.setup = setup
        self.engine_placements = engine_placements
        self.router: Router | None = None
        self.engines: list[Any] = []
        self.engine_urls: list[str] = []
        self.rewards: RewardHub | None = None  # built with the data (remote_rm's session lives in it)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Start every engine, then launch (or join) the router and load the data while their servers come
        up; register each engine once healthy. Returns the router URL."""
        r, s = self.setup.rollout, self.setup
        if s.load_rollout_data is not None:  # replaying dumps: nothing to generate with
            self.data_source = self.eval_source = None
            return ""
        log_dir = Path(s.log_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        launched = self._launch_engines(log_dir)
        if r.router.address:
            self.router = Router.connect(r.router.address)
        else:
            self.router = Router.launch(host=s.host, cfg=r.router, log_path=str(log_dir / "router.log"))
        self._load_data()
        ray.get(launched)
        self.engine_urls = ray.get([engine.wait_until_ready.remote() for engine in self.engines])
        for url in self.engine_urls:
            self.router.add_worker(url)
        return self.router.url

    def _launch_engines(self, log_dir: Path) -> list:
        """Create one engine actor per placement and have each start its server; returns the launch refs."""
        r, s = self.setup.rollout, self.setup
        engine_cls = ray.remote(get_engine_class(r.engine))
        engine_config = getattr(r, r.engine)  # the kind's own typed config: rollout.hf, rollout.sglang, ...
        # An engine's server uses every GPU of its bundles: Ray must not narrow CUDA_VISIBLE_DEVICES to one.
        env = (
            {"runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}
            if s.device == "cuda"
            else {}
        )
        for rank, placement in enumerate(self.engine_placements):
            launch = EngineLaunch(
                rank=rank,
                model_path=s.model_path,
                host=s.host,
                seed=s.seed + rank,
                device=s.device,
                log_dir=str(log_dir),
                gpu_ids=placement.gpu_ids,
                startup_timeout_s=getattr(engine_config, "startup_timeout_s", 600.0),
            )
            options = placement.first.actor_options(fraction=0.2 if s.colocate else 1.0)
            self.engines.append(engine_cls.options(**options, **env).remote(launch, engine_config))
        return [engine.launch.remote() for engine in self.engines]

    def _load_data(self) -> None:
        """Tokenizer, prompt datasets, the rollout function and the dynamic filter (a bad data config fails here)."""
        from transformers import AutoTokenizer

        s, r, d = self.setup, self.setup.rollout, self.setup.data
        self.tokenizer = AutoTokenizer.from_pretrained(s.model_path)
        self.data_source = self._prompt_source(d.prompt_data, r.n_samples_per_prompt, shuffle=d.shuffle)
        self.rewards = RewardHub.from_config(r)
        self.eval_source = None
        if s.eval.interval:
            self.eval_source = self._prompt_source(s.eval.prompt_data, s.eval.n_samples_per_prompt, shuffle=False)
        # validation resolved rollout.function (a registry name, a path or null) to an import path
        self.rollout_fn = load_callable(r.function, key="rollout.function")
        self.dynamic_filter = (
            load_callable(s.algo.dynamic_filter, key="algo.dynamic_filter") if s.algo.dynamic_filter else None
        )

    def _prompt_source(self, path: str, n_samples_per_prompt: int, *, shuffle: bool) -> DataSourceBase:
        """A data source over the prompt file at `path`, read with `data`'s keys and templating; the class is
        `data.source_class` when set."""
        return build_data_source(
            self.setup.data,
            path,
            tokenizer=self.tokenizer,
            n_samples_per_prompt=n_samples_per_prompt,
            shuffle=shuffle,
            max_prompt_len=self.setup.rollout.max_prompt_len,
        )

    def urls(self) -> list[str]:
        """The URL of every engine, in engine rank order (what weight sync pushes to)."""
        return list(self.engine_urls)

    def shutdown(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        for url in self.engine_urls:
            try:
                if self.router is not None:
                    self.router.remove_worker(url)
            except Exception as exc:  # teardown continues past a dead router
                logger.warning("deregistering %s failed: %s", url, exc)
        for engine in self.engines:
            try:
                ray.get(engine.shutdown.remote())
            except Exception as exc:
                logger.warning("engine shutdown failed: %s", exc)
        self.engines = []
        if self.router is not None:
            self.router.shutdown()
            self.router = None

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
            router_url=self.router.url,
            tokenizer=self.tokenizer,
            data_source=source,
            batch_size=batch,
            over_sampling_batch_size=batch if evaluation else r.over_sampling_batch_size,
            sampling_params=sampling,
            max_in_flight=r.concurrency * len(self.engines),
            rewards=self.rewards,
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

        out = self._rollout(rollout_id)
        groups = out.groups
        if len(groups) != self.setup.rollout.batch_size:
            raise RuntimeError(
                f"the rollout function returned {len(groups)} groups, expected rollout.batch_size="
                f"{self.setup.rollout.batch_size}"
            )
        samples = [s for g in groups for s in g]
        if self.setup.save_rollout_data:
            save_rollout_data(self.setup.log_dir, rollout_id, groups)
        a = self.setup.algo
        failures = check_failures(samples, self.setup.rollout.reward.max_failure_ratio)
        raw = torch.tensor([s.scalar_reward(self.setup.rollout.reward_key) for s in samples], dtype=torch.float64)
        metrics = {**out.metrics, **failures, **rollout_metrics(groups, raw, self.setup.rollout.n_samples_per_prompt)}
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
        return batches, metrics, preview

    def _rollout(self, rollout_id: int) -> RolloutOutput:
        """The rollout function's step, or the step's dump under debug.load_rollout_data."""
        if self.setup.load_rollout_data is None:
            return self.rollout_fn(self._context(evaluation=False), rollout_id, evaluation=False)
        start = time.perf_counter()
        groups = load_rollout_data(self.setup.load_rollout_data, rollout_id)
        return RolloutOutput(groups=groups, metrics={"perf/rollout_time": time.perf_counter() - start})

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

        if self.data_source is None:  # replaying dumps: no data source
            return
        target = Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")  # renamed once complete: a killed save leaves no .pt
        torch.save(self.data_source.state_dict(), partial)
        partial.replace(target)

    def load(self, rollout_id: int, root: str) -> None:
        import torch

        if self.data_source is None:
            return
        path = Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint.load={root}: no data-source state {path}")
        # weights_only: tensors and plain containers only, nothing a checkpoint file could execute
        self.data_source.load_state_dict(torch.load(path, weights_only=True))
