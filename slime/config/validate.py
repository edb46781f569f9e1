"""Cross-field validation: every rule runs before Ray starts and all problems are reported at once.

Each problem names the key, its value, what is wrong and the override that fixes it. `main.py`
turns a `ConfigError` into exit status 2. The rules live by topic:

    validate.py            choices (from slime.registry), logger packages, ranges, batch arithmetic, debug hooks
    validate_resources.py  GPU arithmetic, roles' placement, options the chosen parts cannot honour
    validate_algo.py       algorithm knobs and rewards
    validate_paths.py      paths that must exist, paths a run writes
    validate_hooks.py      import-path fields: resolved and call-shape checked
    validate_data.py       prompt files (every record), run length, data source class, rewards, rollout dumps
    validate_async.py      the one-step-async loop (train.async) and the weight-sync interval
    passthrough.py         rollout.router.extra_args, rollout.sglang, rollout.vllm, parallelism.megatron
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from slime.config.derive import Derived, derive
from slime.config.hf_config import FAMILIES, check_model
from slime.config.objective import check_objective
from slime.config.passthrough import check_passthrough
from slime.config.problems import ConfigError, Problem, get, one_of, positive
from slime.config.schema import RUN_PHASES, RunConfig
from slime.config.validate_algo import check_algo, check_rewards
from slime.config.validate_async import check_async
from slime.config.validate_data import check_data
from slime.config.validate_eval import check_eval, check_rollout_loop
from slime.config.validate_hooks import check_hooks
from slime.config.validate_keys import check_unknown_keys
from slime.config.validate_paths import check_paths
from slime.config.validate_resources import check_cluster, check_parts_honour_options
from slime.registry import ENGINES, TRAIN_BACKENDS, WEIGHT_SYNC, Registry

__all__ = ["ConfigError", "Problem", "collect_problems", "validate"]

ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo", "sft")
TIS_MODES = ("truncate", "icepop")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
DEVICES = ("cpu", "cuda")
LR_DECAY_STYLES = ("constant", "linear", "cosine")
PRECISIONS = ("auto", "fp32", "bf16")
WANDB_MODES = ("online", "offline", "disabled", "auto")
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")


def _registered(registry: Registry, value: str) -> Iterator[Problem]:
    if value not in registry:
        yield Problem(
            registry.key,
            value,
            registry.unknown_message(value),
            f"set {registry.key}=<one of {', '.join(registry.names())}>",
        )


def check_choices(cfg: RunConfig) -> Iterator[Problem]:
    yield from _registered(TRAIN_BACKENDS, cfg.parallelism.backend)
    yield from _registered(ENGINES, cfg.rollout.engine)
    yield from _registered(WEIGHT_SYNC, cfg.rollout.weight_sync.mode)
    yield from one_of("algo.advantage_estimator", cfg.algo.advantage_estimator, ADVANTAGE_ESTIMATORS)
    yield from one_of("algo.kl_loss_type", cfg.algo.kl_loss_type, KL_TYPES)
    yield from one_of("algo.tis_mode", cfg.algo.tis_mode, TIS_MODES)
    yield from one_of("cluster.device", cfg.cluster.device, DEVICES)
    yield from one_of("model.architecture", cfg.model.architecture, FAMILIES)
    yield from one_of("train.lr_decay_style", cfg.train.lr_decay_style, LR_DECAY_STYLES)
    yield from one_of("train.precision", cfg.train.precision, PRECISIONS)
    yield from one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)


def check_sinks(cfg: RunConfig) -> Iterator[Problem]:
    """The logger's packages are installed (found at start-up, not after the cluster has started)."""
    from slime.tracking.wandb_run import resolve_mode  # pure Python: the run's own rule for mode=auto

    resolved = resolve_mode(cfg.logger.wandb)
    if resolved != "disabled" and importlib.util.find_spec("wandb") is None:
        yield Problem(
            "logger.wandb.mode",
            cfg.logger.wandb.mode,
            f"logs to wandb ({resolved}), but the wandb package is not installed",
            "pip install wandb, or set logger.wandb.mode=disabled",
        )
    if cfg.logger.tensorboard and importlib.util.find_spec("tensorboard") is None:
        yield Problem(
            "logger.tensorboard",
            True,
            "writes TensorBoard event files, but the tensorboard package is not installed",
            "pip install '.[tensorboard]', or set logger.tensorboard=false",
        )


def check_debug(cfg: RunConfig) -> Iterator[Problem]:
    d = cfg.debug
    yield from one_of("debug.signal", d.signal, SIGNALS)
    if d.signal_delay_s < 0:
        yield Problem("debug.signal_delay_s", d.signal_delay_s, "must be >= 0", "set debug.signal_delay_s=0")
    for key, value in (("debug.signal_at", d.signal_at), ("debug.hang_at", d.hang_at)):
        if value is None:
            continue
        phase, _, rollout_id = value.partition(":")
        if phase not in RUN_PHASES or (rollout_id and not rollout_id.lstrip("-").isdigit()):
            yield Problem(
                key,
                value,
                f"must be PHASE or PHASE:ROLLOUT_ID with PHASE one of {list(RUN_PHASES)}",
                f"set {key}=rollout:1, or null",
            )
    if d.hang_at is not None and d.hang_at.partition(":")[0] in ("prepare", "startup", "teardown"):
        yield Problem(
            "debug.hang_at",
            d.hang_at,
            "hangs the trainer, which exists from weight_sync to save",
            "set debug.hang_at=train",
        )
    if cfg.checkpoint.resume is not None:
        yield from one_of("checkpoint.resume", cfg.checkpoint.resume, ("auto",))
    if cfg.checkpoint.resume == "auto" and cfg.checkpoint.load is not None:
        yield Problem(
            "checkpoint.resume",
            "auto",
            f"conflicts with checkpoint.load={cfg.checkpoint.load} (auto resumes from checkpoint.save)",
            "drop one: checkpoint.resume=null, or checkpoint.load=null",
        )
    timeout = cfg.runtime.phase_timeout_s
    if timeout is not None and not timeout > 0:
        yield Problem(
            "runtime.phase_timeout_s",
            timeout,
            "must be > 0 seconds (or null: no limit)",
            "set runtime.phase_timeout_s=3600",
        )


def check_ranges(cfg: RunConfig) -> Iterator[Problem]:
    yield from positive(
        cfg,
        "rollout.batch_size",
        "rollout.n_samples_per_prompt",
        "rollout.max_response_len",
        "rollout.concurrency",
        "train.num_rollout",
        "train.num_epoch",
        "train.num_steps_per_rollout",
        "train.lr",
        "parallelism.micro_batch_size",
        "rollout.hf.max_batch_size",
        "rollout.weight_sync.bucket_mb",
    )
    yield from positive(cfg, "checkpoint.save_interval", "eval.interval", "logger.log_samples_every")
    for key in ("checkpoint.ckpt_step", "logger.log_samples", "logger.progress_every_s"):
        value = get(cfg, key)
        if value is not None and value < 0:
            yield Problem(
                key, value, "must be >= 0", f"set {key}=0" + (" or null" if key.startswith("checkpoint") else "")
            )
    r, context = cfg.rollout, cfg.model.max_position_embeddings
    if (r.max_prompt_len or 0) + r.max_response_len > context:
        prompt = f"rollout.max_prompt_len={r.max_prompt_len} + " if r.max_prompt_len else ""
        yield Problem(
            "rollout.max_response_len",
            r.max_response_len,
            f"{prompt}rollout.max_response_len={r.max_response_len} tokens exceed the model's context "
            f"(model.max_position_embeddings={context})",
            "lower rollout.max_response_len (and rollout.max_prompt_len), or raise model.max_position_embeddings "
            "if the model supports it",
        )
    if cfg.rollout.temperature <= 0:
        yield Problem(
            "rollout.temperature",
            cfg.rollout.temperature,
            "must be > 0 (log-probs are taken from logits / temperature)",
            "set rollout.temperature=1.0",
        )
    if not 0 < cfg.rollout.top_p <= 1:
        yield Problem("rollout.top_p", cfg.rollout.top_p, "must be in (0, 1]", "set rollout.top_p=1.0")
    if cfg.train.clip_grad < 0:
        yield Problem(
            "train.clip_grad", cfg.train.clip_grad, "must be >= 0 (0 disables clipping)", "set train.clip_grad=1.0"
        )
    if (
        cfg.rollout.over_sampling_batch_size is not None
        and cfg.rollout.over_sampling_batch_size < cfg.rollout.batch_size
    ):
        yield Problem(
            "rollout.over_sampling_batch_size",
            cfg.rollout.over_sampling_batch_size,
            f"must be >= rollout.batch_size={cfg.rollout.batch_size}",
            "set it to null (= rollout.batch_size) or larger",
        )


def check_batch_arithmetic(cfg: RunConfig) -> Iterator[Problem]:
    """B_p·n = G·K (REFERENCE.md §1), and G splits evenly over data-parallel ranks."""
    r, t = cfg.rollout, cfg.train
    if min(r.batch_size, r.n_samples_per_prompt, t.num_steps_per_rollout) <= 0:
        return  # reported by check_ranges
    samples = r.batch_size * r.n_samples_per_prompt
    k = t.num_steps_per_rollout
    if t.global_batch_size is None:
        if samples % k:
            yield Problem(
                "train.num_steps_per_rollout",
                k,
                f"rollout.batch_size × rollout.n_samples_per_prompt = {r.batch_size} × {r.n_samples_per_prompt} = "
                f"{samples} samples do not split into {k} equal optimizer steps",
                f"pick train.num_steps_per_rollout dividing {samples}",
            )
        return
    g = t.global_batch_size
    if g * k != samples:
        suggestion = f"train.global_batch_size={samples // k}" if samples % k == 0 else "train.global_batch_size=null"
        yield Problem(
            "train.global_batch_size",
            g,
            f"rollout.batch_size × rollout.n_samples_per_prompt = {r.batch_size} × {r.n_samples_per_prompt} = {samples} "
            f"must equal train.global_batch_size × train.num_steps_per_rollout = {g} × {k} = {g * k}",
            f"set {suggestion} (or change rollout.batch_size / train.num_steps_per_rollout)",
        )


def collect_problems(cfg: RunConfig) -> list[Problem]:
    derived = derive(cfg)
    checks = [
        check_unknown_keys(cfg),
        check_choices(cfg),
        check_sinks(cfg),
        check_debug(cfg),
        check_ranges(cfg),
        check_model(cfg.model, backend=cfg.parallelism.backend),
        check_batch_arithmetic(cfg),
        check_cluster(cfg, derived),
        check_parts_honour_options(cfg, derived),
        check_async(cfg),
        check_algo(cfg),
        check_rewards(cfg),
        check_hooks(cfg),
        check_eval(cfg),
        check_rollout_loop(cfg),
        check_passthrough(cfg),
        check_paths(cfg),
        check_objective(cfg),
        check_data(cfg),
    ]
    return [problem for check in checks for problem in check]


def validate(cfg: RunConfig) -> Derived:
    """Raise ConfigError listing every problem; return the derived values when there are none."""
    problems = collect_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return derive(cfg)
