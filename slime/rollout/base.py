"""What every rollout hook is given (`args`: the `RolloutContext`) and what rollout functions return.

The rollout manager builds one context per rollout call. It carries the run's rollout config (so a hook
reads `args.config.max_turns` or any field it needs, like slime's `args`), the router URL and tokenizer,
the base sampling parameters, the loaded hooks, and the state of the call in progress (`aborted`,
the HTTP session of the default generate function).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from slime.config.hooks import load_callable
from slime.config.schema import AlgoConfig, RolloutConfig
from slime.rollout.entry_points import (
    BUFFER_FILTER_SHAPE,
    FILTER_SHAPE,
    GENERATE_SHAPE,
    REWARD_POST_PROCESS_SHAPE,
    SAMPLE_HOOK_SHAPE,
)
from slime.types import Sample


@dataclasses.dataclass(kw_only=True)
class RolloutHooks:
    """The loaded extension points of the rollout loop (docs/data-and-rewards.md#custom-code-hooks gives each call shape); None: built-in."""

    generate: Callable[..., Any] | None = None  # async (args, sample, sampling_params[, evaluation]) -> Sample
    dynamic_filter: Callable[..., Any] | None = None  # (args, group) -> bool | FilterResult
    buffer_filter: Callable[..., Any] | None = None  # (args, rollout_id, buffer, num) -> groups
    reward_post_process: Callable[..., Any] | None = None  # (args, samples) -> (raw_rewards, rewards)
    sample_hooks: list[Callable[..., Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, rollout: RolloutConfig, algo: AlgoConfig) -> RolloutHooks:
        """Import every configured hook (validation checked them already; this repeats its checks)."""

        def one(key: str, spec: Any, shape: dict) -> Callable[..., Any] | None:
            return None if spec is None else load_callable(spec, key=key, **shape)

        return cls(  # an agent run's generate is its episodes' (slime.rollout.producer sets it)
            generate=one("rollout.generate_function", rollout.generate_function, GENERATE_SHAPE),
            dynamic_filter=one("algo.dynamic_filter", algo.dynamic_filter, FILTER_SHAPE),
            buffer_filter=one("rollout.buffer_filter", rollout.buffer_filter, BUFFER_FILTER_SHAPE),
            reward_post_process=one(
                "rollout.reward_post_process", rollout.reward_post_process, REWARD_POST_PROCESS_SHAPE
            ),
            sample_hooks=[
                load_callable(spec, key=f"rollout.sample_hooks[{i}]", **SAMPLE_HOOK_SHAPE)
                for i, spec in enumerate(rollout.sample_hooks)
            ],
        )


@dataclasses.dataclass(kw_only=True)
class EvalDataset:
    """One named eval dataset, resolved: its data source and its own sampling and reward settings."""

    name: str
    source: Any  # a DataSource over its prompts (rewound), n_samples_per_prompt copies per group
    num_prompts: int  # groups one eval runs: every prompt once
    n_samples_per_prompt: int
    sampling_params: dict[str, Any]  # SGLang sampling params; max_new_tokens is its response budget
    rm_type: str | None
    reward_key: str | None


@dataclasses.dataclass
class RolloutProgress:
    """Group counts of the train rollout under way, for the live progress display (counts of groups).

    The rollout function updates it as groups finish (`args.progress`); the rollout manager hands a copy
    to the driver when asked, from another thread, so fields are only ever replaced, never half-written.
    """

    needed: int = 0  # rollout.batch_size: groups the step keeps
    kept: int = 0  # finished and past the dynamic filter
    submitted: int = 0  # drawn from the data source (over-sampling draws more than needed)
    in_flight: int = 0  # submitted, not judged yet
    dropped: int = 0  # rejected by the dynamic filter


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamLimits:
    """train.async=full's stream bounds (slime.rollout.stream): groups per trainer step, the staleness bound
    (weight versions), what a stale group gets (regenerated, or dropped)."""

    batch_size: int
    max_staleness: int
    regenerate_stale: bool
    # fault tolerance: a group whose generation failed (a dead engine or router) is kept and runs again at the next
    # take, which raises GroupsFailed meanwhile; without it the first failure ends the stream
    keep_failed: bool = False

    @property
    def max_ahead(self) -> int:
        """Groups started and not yet taken, plus those the current step has taken, at most: AReaL's staleness
        bound (areal/infra/staleness_manager.py: get_capacity, at most (max_staleness + version + 1) x batch_size
        started since the run's first) once the steps before the current version took theirs. The trainer takes
        `batch_size` a step in start order, so the group started now is taken within `max_staleness` versions."""
        return (self.max_staleness + 1) * self.batch_size


@dataclasses.dataclass(kw_only=True)
class RolloutContext:
    """`args` of every rollout hook; built by the rollout manager for each rollout call."""

    config: RolloutConfig  # the run's rollout config: every field a hook may read (max_turns, ...)
    router_url: str  # the policy model's router
    tokenizer: Any
    batch_size: int  # groups to keep (train); an eval runs every prompt of its datasets
    over_sampling_batch_size: int  # groups per refill
    sampling_params: dict[str, Any]  # SGLang sampling params; max_new_tokens is the response budget (tokens)
    max_in_flight: int  # concurrency × number of engines
    rewards: Any  # the RewardHub: scores samples (rollout.rm_type / custom_rm_path / group_rm)
    rm_type: str | None = None  # an eval dataset's own rm_type (None: the hub's)
    reward_key: str | None = None  # the scalar of dict rewards
    hooks: RolloutHooks = dataclasses.field(default_factory=RolloutHooks)
    max_filter_drops: int = 0  # past this many drops in one step, groups are kept regardless (no endless loop)
    sampling_seed: int | None = None  # base of per-request seeds (rollout.deterministic); None: engine's RNG
    eval_datasets: list[EvalDataset] = dataclasses.field(default_factory=list)
    model_routers: dict[str, str] = dataclasses.field(default_factory=dict)  # every served model's router by name
    request_timeout_s: float | None = None  # per /generate attempt (rollout.request_timeout_s)
    return_routed_experts: bool = False  # ask the engine for each token's MoE experts (algo.routing_replay=rollout)
    lora_adapter: str | None = None  # the policy's LoRA adapter every request names (SGLang's lora_path); None: none
    agent: Any = None  # rollout.agent.entrypoint's AgentService (slime.rollout.agent.episode); None: no agent
    prompt_images: Any = None  # a vision-language model's slime.vision.prompt.PromptImages; None: text prompts
    # State of the call in progress: set once the batch is full (samples not yet started are not generated, and
    # multi-turn generate functions should stop between turns), and the HTTP session of the running event loop.
    aborted: bool = False
    session: Any = None
    worker_urls: list[str] | None = None  # the router's workers, read once per call by requests that bypass it
    progress: RolloutProgress = dataclasses.field(default_factory=RolloutProgress)  # group counts so far


@dataclasses.dataclass
class RolloutOutput:
    """What a train rollout returns: the kept groups (each n samples) and its metrics."""

    groups: list[list[Sample]]
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class EvalOutput:
    """What an eval rollout returns: each dataset's groups by dataset name, and extra metrics."""

    datasets: dict[str, list[list[Sample]]]
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


def as_rollout_output(result: Any, key: str) -> RolloutOutput:
    """A rollout function's result as a RolloutOutput (a bare list of groups, slime's older form, too)."""
    if isinstance(result, RolloutOutput):
        return result
    if isinstance(result, list) and all(isinstance(g, list) for g in result):
        return RolloutOutput(groups=result)
    raise TypeError(f"{key} returned {type(result).__name__}; expected a RolloutOutput or a list of sample groups")


def as_eval_output(result: Any, key: str) -> EvalOutput:
    """An eval function's result as an EvalOutput (a bare {dataset name: groups} dict too)."""
    if isinstance(result, EvalOutput):
        return result
    if isinstance(result, dict) and all(isinstance(g, list) for g in result.values()):
        return EvalOutput(datasets=result)
    raise TypeError(f"{key} returned {type(result).__name__}; expected an EvalOutput or {{dataset name: groups}}")


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a hook that may be a plain or an async def."""
    result = fn(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes a keyword argument `name` (or **kwargs): optional arguments of a hook's call shape."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
