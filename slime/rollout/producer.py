"""The rollout manager's torch side: prompts in, one `TrainBatch` per data-parallel rank out.

It owns the tokenizer, the prompt data sources (train and eval), the rollout functions, hooks and rewards; it runs
the configured rollout function, post-processes rewards (group normalisation,
docs/algorithms.md#reward-post-processing), splits the step's samples over the data-parallel ranks, evaluates, and
saves or restores the data source's cursor and this process's generators with a checkpoint. Only the rollout
manager's actor process imports it (torch and transformers, ~2 CPU-seconds): the manager builds it once its engines
were launched (slime.rollout.manager.actor), so the driver, which imports the manager to define the actor, loads no
torch. It reaches the engines through what `Engines` names (the manager's EngineFleet).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoTokenizer

from slime.config.hooks import load_callable
from slime.config.routing_replay import RoutingReplay
from slime.engine.client import EngineClient
from slime.engine.memory_report import engine_memory_metrics
from slime.rollout.agent.episode import generate as episode_generate
from slime.rollout.agent.episode import start_agent
from slime.rollout.agent.turn_samples import expand_steps
from slime.rollout.base import (
    EvalDataset,
    RolloutContext,
    RolloutHooks,
    RolloutOutput,
    RolloutProgress,
    as_eval_output,
    as_rollout_output,
)
from slime.rollout.data_identity import prompt_identity, write_identity
from slime.rollout.data_source import DataSourceBase, build_data_source
from slime.rollout.dumps import load_rollout_data, save_rollout_data
from slime.rollout.entry_points import ROLLOUT_FN_SHAPE, function_path
from slime.rollout.eval_metrics import eval_metrics
from slime.rollout.postprocess import rollout_metrics, split_for_data_parallel
from slime.rollout.probe import probe_engines
from slime.rollout.rewards import RewardHub, check_failures
from slime.rollout.setup import ROLLOUT_CLOCK, RolloutSetup
from slime.rollout.staleness import record_staleness
from slime.rollout.step_result import checked_samples, sample_preview, step_rewards
from slime.rollout.stream import GroupStream
from slime.sync.probe import EngineProbe
from slime.train.checkpoint_files import save_state_files
from slime.train.rng import rng_state, set_rng_state
from slime.types import SampleStatus, TrainBatch
from slime.vision.prompt import PromptImages


class Engines(Protocol):
    """What the producer asks of the run's engines (slime.rollout.manager.engine_fleet.EngineFleet)."""

    def router_url(self) -> str: ...  # the policy's router

    def model_routers(self) -> dict[str, str]: ...  # each served model's router, by model name

    def num_generating_engines(self) -> int: ...

    def clients(self) -> list[EngineClient]: ...

    def abort_and_wait_idle(self) -> None: ...


MAX_FILTER_DROPS_PER_GROUP = 10  # a filter may reject this many groups per kept group before everything is kept
EVAL_SEED_OFFSET = 1_000_003  # eval requests draw from their own seed stream (rollout.deterministic)


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


class RolloutProducer:
    """Created empty (no data); `load_data()` reads the tokenizer, the prompt files, the functions and hooks."""

    def __init__(self, setup: RolloutSetup, fleet: Engines):
        self.setup = setup
        self.fleet = fleet  # the router URLs, the engine count, the abort after each step
        self.tokenizer = None
        self._probe_tokenizer = None  # the log-prob probe's copy (`probe`)
        self.data_source: DataSourceBase | None = None  # None when replaying dumps
        self.eval_sources: dict[str, DataSourceBase] = {}
        self.rewards: RewardHub | None = None  # built with the data (remote_rm's session lives in it)
        self.hooks = RolloutHooks()
        self.rollout_fn = self.eval_fn = None  # set by load_data (none when replaying dumps)
        self.prompt_identity: dict[str, Any] | None = None  # data.prompt_data's file and sha256 (data_identity.py)
        # (rollout id, the data source's state before that rollout drew): a save of the rollout before it writes
        # this state, so the one-step-async loop's in-flight rollout is drawn again on resume (never skipped)
        self._cursor_before: tuple[int, dict[str, Any]] | None = None
        self.stream: GroupStream | None = None  # train.async=full, once started
        self.agent = None  # rollout.agent.entrypoint's AgentService (its gateway serves), built by load_data
        self.prompt_images = None  # a vision-language model's (slime.vision.prompt), for image prompts
        self._stream_state: dict[str, Any] | None = None  # a checkpoint's stream, until the stream starts

    # ---- data --------------------------------------------------------------------------------
    def load_data(self) -> None:
        """Tokenizer, prompt datasets (train and eval), the rollout functions and hooks (a bad data config fails
        here). Replaying dumps (debug.load_rollout_data): the hooks only (reward_post_process still applies)."""
        s, r, d = self.setup, self.setup.rollout, self.setup.data
        if s.load_rollout_data is None:
            self.tokenizer = AutoTokenizer.from_pretrained(s.model_path)
            if d.multimodal_keys.get("image"):  # validation checked that the model reads images
                self.prompt_images = PromptImages.of_checkpoint(s.model_path)
            self.prompt_identity = prompt_identity(d.prompt_data)  # saved with the cursor, checked on resume
            self.data_source = self._prompt_source(
                d.prompt_data, r.n_samples_per_prompt, shuffle=d.shuffle, max_groups=s.max_train_groups
            )
            self.rewards = RewardHub.from_config(r)
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
        if r.agent.entrypoint is not None:  # every sample is an agent episode
            self.hooks = dataclasses.replace(self.hooks, generate=episode_generate)
        if r.agent.entrypoint is not None and s.load_rollout_data is None:
            self.agent = start_agent(r.agent)

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
            prompt_images=self.prompt_images,
        )

    def close(self) -> None:
        self.stop_stream()
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.rewards is not None:
            self.rewards.close()

    # ---- train.async=full --------------------------------------------------------------------------
    def start_stream(self, trainer_version: int) -> None:
        """Start generating continuously (slime.rollout.stream), from a checkpoint's stream when loaded."""
        ctx = self._context(RolloutProgress(needed=self.setup.rollout.batch_size), evaluation=False)
        self.stream = GroupStream(ctx, self.data_source, self.setup.stream)
        if self._stream_state is not None:
            self.stream.load_state_dict(self._stream_state)
            self._stream_state = None
        self.stream.start(trainer_version)

    def stop_stream(self) -> None:
        """Abort what the stream generates and stop it (the run's last step was taken)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
            self.fleet.abort_and_wait_idle()

    def restarted(self) -> None:
        """Engines or a router that died serve again: the stream's groups that failed on them run again
        (GroupStream.restarted); nothing without a stream."""
        if self.stream is not None:
            self.stream.restarted()

    # ---- rollout -----------------------------------------------------------------------------
    def _context(self, progress: RolloutProgress, *, evaluation: bool) -> RolloutContext:
        s, r = self.setup, self.setup.rollout
        batch = r.batch_size
        return RolloutContext(
            config=r,
            router_url=self.fleet.router_url() if s.load_rollout_data is None else "",  # none when replaying dumps
            model_routers=self.fleet.model_routers() if s.load_rollout_data is None else {},
            request_timeout_s=r.request_timeout_s,
            return_routed_experts=RoutingReplay(s.algo.routing_replay).engine_returns_routes and not evaluation,
            lora_adapter=s.fleet.lora.adapter_name if s.fleet.lora else None,
            agent=self.agent,
            prompt_images=self.prompt_images,
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
            progress=progress,
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

    def rollout_step(
        self, rollout_id: int, progress: RolloutProgress
    ) -> tuple[list[TrainBatch], dict[str, float], list[dict]]:
        """One training rollout step: (per-DP-rank batches, rollout metrics, a few samples for the log).

        The rollout function counts its groups in `progress` as it goes (the manager answers `progress()` from
        it); each sample's staleness is taken against trainer weight version `rollout_id` (rollout/staleness.py)."""
        started = time.time()
        if self.data_source is not None:
            self._cursor_before = (rollout_id, copy.deepcopy(self.data_source.state_dict()))
        ctx = self._context(progress, evaluation=False)
        out = self._rollout(ctx, rollout_id)
        engine_memory = engine_memory_metrics(self.fleet.clients()) if self.setup.load_rollout_data is None else {}
        groups = out.groups
        samples = checked_samples(groups, batch_size=self.setup.rollout.batch_size, rollout_id=rollout_id)
        staleness = record_staleness(samples, trainer_version=rollout_id)
        if self.setup.save_rollout_data:
            save_rollout_data(self.setup.log_dir, rollout_id, groups)
        failures = check_failures(samples, self.setup.rollout.reward.max_failure_ratio)
        raw, rewards, shaping = step_rewards(
            samples, hooks=self.hooks, ctx=ctx, algo=self.setup.algo, rollout=self.setup.rollout
        )
        metrics = {
            **out.metrics,
            **failures,
            **(self.rewards.remote_metrics("rollout") if self.rewards is not None else {}),
            **rollout_metrics(groups, raw, self.setup.rollout.n_samples_per_prompt),
            **shaping,
            **staleness,
            **engine_memory,
        }
        metrics["rollout/rewards"] = float(rewards.mean())
        metrics["rollout/num_prompts"] = float(len({s.group_index for s in samples}))
        metrics["rollout/num_aborted"] = float(sum(s.status == SampleStatus.ABORTED for s in samples))
        preview = sample_preview(samples, rollout_id, max(self.setup.rollout.n_samples_per_prompt, 4))
        s = self.setup
        raw_list, reward_list, steps = raw.tolist(), rewards.tolist(), [s.global_batch_size] * s.num_steps_per_rollout
        if s.rollout.agent.samples == "turns":
            samples, raw_list, reward_list, steps = expand_steps(
                samples, raw_list, reward_list, global_batch_size=s.global_batch_size, num_steps=s.num_steps_per_rollout
            )
        batches = split_for_data_parallel(
            samples, raw_list, reward_list, step_sizes=steps, dp_size=s.dp_size, balance_tokens=s.balance_tokens
        )
        metrics.update(zip(ROLLOUT_CLOCK, (started, time.time())))
        return batches, metrics, preview

    def probe(self, urls: list[str], max_new_tokens: int) -> tuple[list[EngineProbe], list[TrainBatch]]:
        """The log-prob probe's engine side (slime.rollout.probe.probe_engines): each engine's answer, in the order of
        `urls`, and the batches every data-parallel rank scores."""
        if self._probe_tokenizer is None:  # the probe runs on its own thread: a fast tokenizer is not shared
            self._probe_tokenizer = copy.deepcopy(self.tokenizer)
        ctx = dataclasses.replace(self._context(RolloutProgress(), evaluation=False), tokenizer=self._probe_tokenizer)
        samples, batches = probe_engines(ctx, urls, max_new_tokens, self.setup.dp_size)
        tokens = [(s.tokens[s.prompt_length :], list(s.rollout_log_probs or [])) for s in samples]
        return [EngineProbe(url, *answer) for url, answer in zip(urls, tokens)], batches

    def rewind(self, rollout_id: int) -> bool:
        """Put the data source back where training rollout `rollout_id` began (its cursor and buffer), so that the
        step can be generated again; False where it cannot be (a replay of dumps, or a cursor of another step).
        train.async=full's stream: a failed take gave its groups back and keeps the failed ones
        (StreamLimits.keep_failed, with fault tolerance), so the step can be taken again."""
        if self.stream is not None:
            return self.stream.limits.keep_failed
        before = self._cursor_before
        if self.data_source is None or before is None or before[0] != rollout_id:
            return False
        self.data_source.load_state_dict(copy.deepcopy(before[1]))
        return True

    def _rollout(self, ctx: RolloutContext, rollout_id: int) -> RolloutOutput:
        """The rollout function's step, the stream's (train.async=full), or the step's dump under
        debug.load_rollout_data."""
        if self.stream is not None:
            start = time.perf_counter()
            groups, metrics = self.stream.take(rollout_id, ctx.progress)
            return RolloutOutput(groups=groups, metrics={**metrics, "perf/rollout_time": time.perf_counter() - start})
        if self.setup.load_rollout_data is None:
            if self.hooks.buffer_filter is not None:
                self.data_source.buffer_filter = functools.partial(self.hooks.buffer_filter, ctx, rollout_id)
            out = self.rollout_fn(ctx, rollout_id, self.data_source, evaluation=False)
            self.fleet.abort_and_wait_idle()  # nothing a custom rollout function left running outlives its step
            return as_rollout_output(out, "rollout.function")
        start = time.perf_counter()
        groups = load_rollout_data(self.setup.load_rollout_data, rollout_id)
        return RolloutOutput(groups=groups, metrics={"perf/rollout_time": time.perf_counter() - start})

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Per eval dataset: mean reward, truncation ratio, response length, pass@k and failed rewards
        (`eval/<name>...`); RewardFailureError when more of a dataset's samples failed their reward than
        rollout.reward.max_failure_ratio allows, as for a training rollout."""
        if not self.eval_sources:
            return {}
        ctx = self._context(RolloutProgress(), evaluation=True)  # eval's counts are not reported
        out = as_eval_output(self.eval_fn(ctx, rollout_id, self.data_source, evaluation=True), "eval.function")
        metrics = {**out.metrics, **(self.rewards.remote_metrics("eval") if self.rewards is not None else {})}
        for dataset in ctx.eval_datasets:
            if dataset.name not in out.datasets:
                raise RuntimeError(f"the eval function returned no groups for eval dataset {dataset.name!r}")
            groups = out.datasets[dataset.name]
            samples = [sample for group in groups for sample in group]
            ratio = self.setup.rollout.reward.max_failure_ratio  # the training rollouts' rule
            metrics.update(check_failures(samples, ratio, scope=f"eval/{dataset.name}"))
            metrics.update(eval_metrics(dataset.name, groups, dataset.reward_key))
        return metrics

    # ---- checkpoint --------------------------------------------------------------------------
    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        """`<root>/rollout/`: this process's generators and the data source's cursor and buffer."""
        if self.data_source is None:  # replaying dumps: no data source
            return
        directory = Path(root) / "rollout"
        directory.mkdir(parents=True, exist_ok=True)
        # this actor's generators (user hooks may draw from them), then the data source's cursor and buffer; the
        # one-step-async loop's in-flight rollout drew ahead: its cursor before that draw is saved instead
        drawn_ahead = self._cursor_before is not None and self._cursor_before[0] == rollout_id + 1
        states = {f"rng_{rollout_id}.pt": rng_state()}
        if self.stream is not None:  # one snapshot: the cursor, the finished groups, those in flight
            stream = self.stream.state_dict()
            states[f"global_dataset_state_dict_{rollout_id}.pt"] = stream.pop("data_source")
            states[f"stream_{rollout_id}.pt"] = stream
        else:
            states[f"global_dataset_state_dict_{rollout_id}.pt"] = (
                self._cursor_before[1] if drawn_ahead else self.data_source.state_dict()
            )
        save_state_files(Path(root), rollout_id, states)
        if self.prompt_identity is not None:
            write_identity(directory, self.prompt_identity)

    def load_checkpoint(self, rollout_id: int, root: str) -> None:
        if self.data_source is None:
            return
        path = Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint.load={root}: no data-source state {path}")
        # weights_only: tensors and plain containers only, nothing a checkpoint file could execute
        state = torch.load(path, weights_only=True)
        stream = path.with_name(f"stream_{rollout_id}.pt")
        if self.setup.stream is not None and stream.exists():  # full: the stream restores both once it starts
            self._stream_state = {"data_source": state, **torch.load(stream, weights_only=True)}
        else:
            self.data_source.load_state_dict(state)
        rng = path.with_name(f"rng_{rollout_id}.pt")
        if rng.exists():  # absent from checkpoints of earlier versions
            set_rng_state(torch.load(rng, weights_only=True))
