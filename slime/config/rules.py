"""The rules the schema alone decides: fixed choices, ranges, batch arithmetic, debug options, and the topic
modules' schema-level checks (`schema_problems`). Each problem names the key, its value, what is wrong and the
override that fixes it. The checks of the chosen parts (backend, engine, weight sync, rewards, data, paths)
live next to their code (the model option against its family: slime/models/check.py); slime/plan/validate.py runs them all and reports every problem at once.

    validate_keys.py   keys the schema does not know
    validate_algo.py   algorithm knobs (what the estimator needs: slime/algo/check.py)
    validate_async.py  the one-step-async loop and the weight-sync interval
    validate_eval.py   eval datasets and the rollout loop's options
    validate_lora.py   LoRA adapters: sizes and targets
    validate_addresses.py  the form of every URL and address
    objective.py       the sweep objective
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.objective import check_objective
from slime.config.problems import Problem, get, one_of, positive
from slime.config.schema import PhasePoint, RunConfig
from slime.config.validate_addresses import check_addresses
from slime.config.validate_algo import check_algo
from slime.config.validate_async import check_async
from slime.config.validate_eval import check_eval, check_rollout_loop
from slime.config.validate_keys import check_unknown_keys
from slime.config.validate_lora import check_lora

DEVICES = ("cpu", "cuda")
LR_DECAY_STYLES = ("constant", "linear", "cosine")
ON_NONFINITE = ("stop", "skip")
PRECISIONS = ("auto", "fp32", "bf16")
WANDB_MODES = ("online", "offline", "disabled", "auto")
CONSOLE_MODES = ("plain", "verbose")  # logger.console: slime/driver/console.py
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")


def check_choices(cfg: RunConfig) -> Iterator[Problem]:
    """Fixed lists of values (the registries' names, the estimator's included, are checked by
    slime/plan/validate.py; algo.kl_loss_type, algo.tis_mode and algo.tis_level by slime/algo/check.py)."""
    yield from one_of("cluster.device", cfg.cluster.device, DEVICES)
    yield from one_of("train.lr_decay_style", cfg.train.lr_decay_style, LR_DECAY_STYLES)
    yield from one_of("train.on_nonfinite", cfg.train.on_nonfinite, ON_NONFINITE)
    yield from one_of("train.precision", cfg.train.precision, PRECISIONS)
    yield from one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
    yield from one_of("logger.console", cfg.logger.console, CONSOLE_MODES)


def check_debug(cfg: RunConfig) -> Iterator[Problem]:
    d = cfg.debug
    yield from one_of("debug.signal", d.signal, SIGNALS)
    if d.signal_delay_s < 0:
        yield Problem("debug.signal_delay_s", d.signal_delay_s, "must be >= 0", "set debug.signal_delay_s=0")
    points = {}
    for key, value in (
        ("debug.signal_at", d.signal_at),
        ("debug.hang_at", d.hang_at),
        ("debug.nonfinite_at", d.nonfinite_at),
        ("debug.kill_engine_at", d.kill_engine_at),
        ("debug.kill_router_at", d.kill_router_at),
    ):
        try:
            points[key] = PhasePoint.parse(value) if value is not None else None
        except ValueError as exc:
            yield Problem(key, value, str(exc), f"set {key}=rollout:1, or null")
    hang_at = points.get("debug.hang_at")
    if hang_at is not None and hang_at.phase in ("prepare", "startup", "teardown"):
        yield Problem(
            "debug.hang_at",
            d.hang_at,
            "hangs the trainer, which exists from weight_sync to save",
            "set debug.hang_at=train",
        )
    nonfinite_at = points.get("debug.nonfinite_at")
    if nonfinite_at is not None and nonfinite_at.phase != "train":
        yield Problem(
            "debug.nonfinite_at", d.nonfinite_at, "poisons a training step's gradient", "set debug.nonfinite_at=train:1"
        )
    for key, what in (("debug.kill_engine_at", "a serving engine"), ("debug.kill_router_at", "the run's router")):
        point = points.get(key)
        if point is not None and point.phase in ("prepare", "startup", "teardown"):
            yield Problem(
                key,
                getattr(d, key.removeprefix("debug.")),
                f"kills {what}, which exists from weight_sync to save",
                f"set {key}=rollout:1",
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
    for key in ("phase_timeout_s", "startup_timeout_s"):
        timeout = getattr(cfg.runtime, key)
        if timeout is not None and not timeout > 0:
            yield Problem(
                f"runtime.{key}",
                timeout,
                "must be > 0 seconds (or null: no limit)",
                f"set runtime.{key}=3600",
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
    yield from positive(cfg, "cluster.peak_tflops")
    for key in ("checkpoint.ckpt_step", "logger.log_samples", "logger.progress_every_s"):
        value = get(cfg, key)
        if value is not None and value < 0:
            yield Problem(
                key, value, "must be >= 0", f"set {key}=0" + (" or null" if key.startswith("checkpoint") else "")
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


def check_fault_tolerance(cfg: RunConfig) -> Iterator[Problem]:
    """With `rollout.fault_tolerance.enabled`: positive interval and timeout, and no negative restart budget."""
    ft, key = cfg.rollout.fault_tolerance, "rollout.fault_tolerance"
    if not ft.enabled:
        return
    yield from positive(cfg, f"{key}.health_check_interval_s", f"{key}.health_check_timeout_s")
    if ft.max_restarts < 0:
        yield Problem(f"{key}.max_restarts", ft.max_restarts, "must be >= 0", f"set {key}.max_restarts=3")


def check_token_limits(cfg: RunConfig) -> Iterator[Problem]:
    """Lengths and token ids against the model: prompt + response within its context, stop ids in its vocabulary."""
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
    if r.max_prompt_len is not None and r.max_prompt_len <= 0:
        yield Problem("rollout.max_prompt_len", r.max_prompt_len, "must be > 0 tokens", "set it, or null")
    outside = [t for t in r.stop_token_ids if not 0 <= t < cfg.model.vocab_size]
    if outside:  # the engines refuse such a request, or index past the logits, once the run has started
        yield Problem(
            "rollout.stop_token_ids",
            r.stop_token_ids,
            f"{outside} outside the vocabulary (model.vocab_size={cfg.model.vocab_size})",
            "give token ids of the model's tokenizer",
        )


def check_batch_arithmetic(cfg: RunConfig) -> Iterator[Problem]:
    """B_p·n = G·K (docs/architecture.md#batch-vocabulary), and G splits evenly over data-parallel ranks."""
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


def check_options(cfg: RunConfig) -> Iterator[Problem]:
    """Options whose meaning needs no chosen part."""
    p = cfg.parallelism
    if p.max_tokens_per_gpu is not None and p.max_tokens_per_gpu < 1:
        yield Problem(
            "parallelism.max_tokens_per_gpu",
            p.max_tokens_per_gpu,
            "must be > 0 (tokens per micro-batch)",
            "set parallelism.max_tokens_per_gpu to a positive token count, or null for micro_batch_size",
        )
    if cfg.train.ref_offload and not (cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0 or cfg.algo.use_opd):
        yield Problem(
            "train.ref_offload",
            True,
            "there is no frozen model to offload (algo.use_kl_loss=false, algo.kl_coef=0, algo.use_opd=false)",
            "set train.ref_offload=false, or use a KL term or on-policy distillation",
        )


def schema_problems(cfg: RunConfig) -> list[Problem]:
    """Every problem the schema alone can find (slime/plan/validate.py then runs the chosen parts' checks)."""
    checks = [
        check_unknown_keys(cfg),
        check_choices(cfg),
        check_debug(cfg),
        check_ranges(cfg),
        check_fault_tolerance(cfg),
        check_token_limits(cfg),
        check_lora(cfg),
        check_batch_arithmetic(cfg),
        check_options(cfg),
        check_async(cfg),
        check_algo(cfg),
        check_eval(cfg),
        check_rollout_loop(cfg),
        check_objective(cfg),
        check_addresses(cfg),
    ]
    return [problem for check in checks for problem in check]
