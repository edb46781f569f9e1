"""Typed schemas of the rollout side: `rollout.*` (router, server groups, weight sync, fault tolerance, rewards).
Re-exported by `slime.config.schema`, which holds the run's other groups; the same rules apply (registered in
Hydra's ConfigStore, units stated per field). Each engine's own options (`rollout.hf`, `rollout.sglang`, ...) live
beside the engine, named by its spec, and join `rollout` in the run's schema (slime/run_schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from slime.config.input_kinds import HOST, HOST_PORT, HTTP_URL, MODEL_CHECKPOINT


@dataclass(kw_only=True)
class RouterConfig:
    """sglang-router (vllm-router with rollout.engine=vllm): launched by the rollout manager unless `address` is given."""

    address: Optional[str] = field(default=None, metadata=HOST_PORT)
    policy: str = "round_robin"
    request_timeout_secs: int = 14400
    startup_timeout_s: float = 60.0
    # Further `sglang_router.launch_router` (`vllm_router.launch_router`) flags by name (cache_threshold: 0.3 ->
    # --cache-threshold 0.3; true: a bare flag); checked against the installed router's own parser.
    # host/port/prometheus/policy/timeout (and the worker lists) are the framework's.
    extra_args: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class WeightSyncConfig:
    """How new weights reach the engines after each training step (docs/engines.md#weight-sync)."""

    # a name of slime.registry.WEIGHT_SYNC: disk (HF files) | distributed (broadcast group) | tensor (shared
    # memory / CUDA IPC; colocated engines only)
    mode: str = "disk"
    bucket_mb: int = 1024  # MiB of HF-named tensors per bucket of the trainer's weight export (one transfer each)
    keep: bool = False  # disk mode: keep each weight_v<version>/ directory after the engines loaded it
    # rollout steps between syncs (slime's --update-weights-interval); > 1 needs train.async=true
    interval: int = 1
    # what a push does to running requests (slime.config.async_mode.PauseMode): abort | in_place; null: in_place
    # under train.async=full, abort otherwise
    pause_mode: Optional[str] = None
    # after every push, each engine's weights are compared with what the trainer pushed, tensor by tensor
    # (docs/engines.md#verified-syncs); false: pushes are trusted
    verify: bool = True
    # what a push whose weights differ does: fail (its check runs beside the next rollout and stops the run, naming
    # the engine, bucket and tensors, before the step trains) | resync (checked inside the push: restart that engine
    # and push to every engine again, at most rollout.fault_tolerance.max_restarts times)
    on_mismatch: str = "fail"
    # verify: after the digests, each engine generates this many tokens of a fixed prompt and the trainer scores
    # them on the weights it pushed (docs/engines.md#the-log-prob-probe); 0: no probe
    probe_tokens: int = 16
    # the probe's largest mean |log-prob difference| per engine; null: by precision (fp32 1e-3, bf16 0.1)
    probe_tolerance: Optional[float] = None
    # after a full push, later pushes carry only the bits that changed (docs/engines.md#delta-pushes); the built-in
    # engine applies them, in tensor and distributed modes, with verify on
    delta: bool = False
    full_every: int = 10  # delta: every this many pushes one is full


@dataclass(kw_only=True)
class RewardConfig:
    """Reward failures and the remote reward model (`rollout.rm_type=remote_rm`, docs/data-and-rewards.md#rewards)."""

    # A sample whose reward function raises or returns NaN is FAILED (its error recorded, zero reward); a rollout
    # step fails the run when more than this fraction of its samples failed.
    max_failure_ratio: float = 0.05
    timeout_s: float = 120.0  # remote_rm: per request
    max_retries: int = 10  # remote_rm: retries of connection errors and 5xx, backoff min(2^attempt, 30) s + jitter
    max_connections: int = 64  # remote_rm: pooled HTTP connections


@dataclass(kw_only=True)
class FaultToleranceConfig:
    """Engine health checks and restarts (slime's --use-fault-tolerance): GET /health of each engine while the
    engines serve (never during a weight push, a pause or a memory release)."""

    enabled: bool = False
    # between probe rounds; short enough that a dead engine leaves its router before a request's retries
    # through it run out (rollout/generate.py: 5 attempts over about 6 s)
    health_check_interval_s: float = 5.0
    # a probe slower than this counts as a failure; SGLang's /health is a generation that gives up after its
    # own SGLANG_HEALTH_CHECK_TIMEOUT (20 s): validation keeps this above that (slime's default: 30 s)
    health_check_timeout_s: float = 30.0
    max_restarts: int = 3  # per engine over the run; one more death fails the run


@dataclass(kw_only=True)
class ServerGroupConfig:
    """Servers of one kind for one served model (slime's --sglang-config `server_groups`)."""

    worker_type: str = "regular"  # regular | prefill | decode (PD disaggregation)
    num_gpus: int = MISSING  # GPUs of the whole group
    num_gpus_per_engine: Optional[int] = None  # default cluster.rollout.num_gpus_per_engine
    overrides: dict[str, Any] = field(default_factory=dict)  # ServerArgs applied on top of rollout.sglang


@dataclass(kw_only=True)
class ServedModelConfig:
    """One served model: its own router and server groups; only `update_weights` models receive syncs."""

    name: str = MISSING  # the key a custom rollout function reaches its router by (ctx.model_routers)
    model_path: Optional[str] = field(
        default=None, metadata=MODEL_CHECKPOINT
    )  # HF dir; default model.hf_checkpoint (the policy)
    update_weights: bool = True
    router: RouterConfig = field(default_factory=RouterConfig)
    server_groups: list[ServerGroupConfig] = field(default_factory=list)


@dataclass(kw_only=True)
class AgentConfig:
    """Agentic rollouts (docs/agents.md): user agent code speaks OpenAI's API to the gateway, which samples every
    turn on token ids and trains each episode as one sample (or each turn: `samples`)."""

    # import path (`package.module:function` or `package.module.function`) of fn(base_url, api_key, record) ->
    # reward | None, def or async def; null: no agent (the rollout's generate function runs)
    entrypoint: Optional[Any] = None
    tool_parser: str = "qwen25"  # how sampled text becomes tool_calls: a name of slime.registry.TOOL_PARSERS
    # what the gateway renders conversations with: a .jinja file, or the import path of a template string
    # (slime.assets.chat_templates.CHATML_TOOLS, for a model whose own template knows no tools); null: the tokenizer's
    chat_template: Optional[str] = None
    on_mismatch: str = "drop_turn"  # a turn the template re-renders otherwise: drop_turn (loss mask 0) | drop_episode
    samples: str = "episode"  # what trains as one sample: the episode | each of its turns (turns)
    max_turns: int = 8  # engine turns per episode
    timeout_s: float = 300.0  # per episode; past it the sample fails
    host: str = field(default="127.0.0.1", metadata=HOST)  # where the gateway listens (a free port is chosen)


@dataclass(kw_only=True)
class RolloutConfig:
    """Generation: the engine, sampling, batch sizes in prompts and samples, rewards, the router and weight sync."""

    engine: str = "hf"  # a name of slime.registry.ENGINES
    batch_size: int = MISSING  # prompts (groups) per rollout step: B_p
    n_samples_per_prompt: int = 1  # n
    over_sampling_batch_size: Optional[int] = None  # groups per refill; default batch_size
    max_response_len: int = 1024  # tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    concurrency: int = 512  # in-flight requests per engine
    # A name of slime.registry.ROLLOUT_FUNCTIONS or the import path (or `_target_` node) of
    # `fn(args, rollout_id, data_source, evaluation=False)`; None: the algorithm's default (sft: "sft", every other:
    # "default"). fill_derived writes the import path.
    function: Optional[Any] = None
    rm_type: Optional[str] = None  # a name of slime.registry.REWARD_TYPES
    custom_rm_path: Optional[str] = None  # import path of `rm(sample) -> float | dict` (def or async def)
    reward_key: Optional[str] = None  # picks the scalar from dict rewards
    # Rewards hub (slime.rollout.rewards): group_rm calls custom_rm_path once per group as rm(args, samples) -> list
    group_rm: bool = False
    rm_url: Optional[str] = field(
        default=None, metadata=HTTP_URL
    )  # remote_rm: the reward model's URL (POST {prompt, response, label} -> JSON)
    reward: RewardConfig = field(default_factory=RewardConfig)
    max_prompt_len: Optional[int] = None  # tokens of the templated prompt; longer prompts are dropped at load
    # Same config + seed => same rollouts, whatever the load or the completion order: per-request sampling
    # seeds derived from `seed` and the sample index, groups kept in submission order, and batch-invariant
    # engines (SGLang's deterministic inference; the hf engine's batch-invariant forward passes).
    deterministic: bool = False
    # The rollout loop and its extension points: hooks are import paths or `_target_` nodes, called with the
    # RolloutContext as `args` (docs/data-and-rewards.md#custom-code-hooks lists every call shape).
    partial_rollout: bool = False  # over-sampled groups cut by the abort go back to the buffer and continue later
    # loss mask 0 for a continued sample's earlier tokens and, where an engine held a request across a push, for those
    # an older weight version sampled (partial_rollout or train.async=full)
    mask_offpolicy_in_partial_rollout: bool = False
    # train.async=full: a group older than train.max_staleness is dropped (counted) or regenerated (its prompt again)
    stale_policy: str = "drop"
    max_turns: int = 1  # generate calls a multi-turn generate function may make per sample
    agent: AgentConfig = field(default_factory=AgentConfig)
    generate_function: Optional[Any] = None  # async fn(args, sample, sampling_params) -> Sample; None: one /generate
    buffer_filter: Optional[Any] = None  # fn(args, rollout_id, buffer, num) -> the groups taken out of the buffer
    reward_post_process: Optional[Any] = None  # fn(args, samples) -> (raw_rewards, rewards); None: the algorithm's
    sample_hooks: list[Any] = field(default_factory=list)  # fn(args, sample, rollout_id=, evaluation=) -> Sample|None
    router: RouterConfig = field(default_factory=RouterConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    # Served models (empty: one model, the policy, on every rollout GPU); their GPUs add up to cluster.rollout.num_gpus
    models: list[ServedModelConfig] = field(default_factory=list)
    # URLs of SGLang servers someone else runs: registered with the policy's router, synced, never started or stopped
    external_engines: list[str] = field(default_factory=list, metadata=HTTP_URL)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    request_timeout_s: float = 3600.0  # one /generate request (then retried, like a failed one)
