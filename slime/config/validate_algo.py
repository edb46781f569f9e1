"""Algorithm knobs: mutually exclusive options, what the estimator needs, ranges."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig

KL_IN_REWARD = ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")


def check_algo(cfg: RunConfig) -> Iterator[Problem]:
    """The `algo.*` knobs: KL, what the estimator needs, ranges."""
    yield from _check_kl(cfg)
    yield from _check_estimator(cfg)
    yield from _check_ranges(cfg)


def _check_kl(cfg: RunConfig) -> Iterator[Problem]:
    """The KL options: the loss or the reward term, never both, each with a reference model."""
    a = cfg.algo
    if a.use_kl_loss and cfg.checkpoint.ref_load is None:
        yield Problem(
            "algo.use_kl_loss",
            True,
            "the KL loss needs a reference model but checkpoint.ref_load is null",
            "set checkpoint.ref_load=<HF dir of the reference model> (e.g. ${model.hf_checkpoint}) "
            "or algo.use_kl_loss=false",
        )
    if a.use_kl_loss and a.kl_coef != 0:
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            "KL in the reward and the KL loss are mutually exclusive",
            "set algo.kl_coef=0 or algo.use_kl_loss=false",
        )
    if a.kl_coef != 0 and a.advantage_estimator not in KL_IN_REWARD:
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            f"KL in the reward shapes {', '.join(KL_IN_REWARD)} rewards; {a.advantage_estimator} ignores it",
            "set algo.kl_coef=0 and use algo.use_kl_loss=true with algo.kl_loss_coef instead",
        )
    if a.kl_coef != 0 and cfg.checkpoint.ref_load is None:
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            "KL in the reward needs a reference model but checkpoint.ref_load is null",
            "set checkpoint.ref_load=<HF dir of the reference model>",
        )


def _check_estimator(cfg: RunConfig) -> Iterator[Problem]:
    """What the advantage estimator needs or cannot use."""
    a = cfg.algo
    if a.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline") and not a.normalize_advantages:
        yield Problem(
            "algo.normalize_advantages",
            False,
            f"{a.advantage_estimator} requires advantage whitening",
            "set algo.normalize_advantages=true",
        )
    if a.use_tis and a.use_rollout_logprobs:
        yield Problem(
            "algo.use_tis",
            True,
            "TIS and algo.use_rollout_logprobs are mutually exclusive",
            "set algo.use_tis=false or algo.use_rollout_logprobs=false",
        )
    if a.advantage_estimator == "sft":
        for key in ("use_tis", "use_rollout_logprobs"):
            if getattr(a, key):
                yield Problem(f"algo.{key}", True, "sft samples have no engine log-probs", f"set algo.{key}=false")
    if a.advantage_estimator == "sft" and cfg.eval.interval:
        yield Problem(
            "eval.interval", cfg.eval.interval, "sft has nothing to generate or reward at eval time", "set eval=none"
        )
    if a.advantage_estimator == "rloo" and cfg.rollout.n_samples_per_prompt < 2:
        yield Problem(
            "rollout.n_samples_per_prompt",
            cfg.rollout.n_samples_per_prompt,
            "rloo's leave-one-out baseline needs at least 2 samples per prompt",
            "set it to 2 or more",
        )
    if a.num_critic_only_steps and a.advantage_estimator != "ppo":
        yield Problem(
            "algo.num_critic_only_steps",
            a.num_critic_only_steps,
            "only ppo has a critic",
            "set algo.num_critic_only_steps=0",
        )


def _check_ranges(cfg: RunConfig) -> Iterator[Problem]:
    """Numeric ranges of the clipping and length knobs."""
    a = cfg.algo
    if a.eps_clip_c is not None and a.eps_clip_c <= 1:
        yield Problem(
            "algo.eps_clip_c", a.eps_clip_c, "the dual-clip constant must be > 1", "set algo.eps_clip_c=3.0 or null"
        )
    if a.tis_clip_low > a.tis_clip:
        yield Problem(
            "algo.tis_clip_low", a.tis_clip_low, f"must be <= algo.tis_clip={a.tis_clip}", "lower algo.tis_clip_low"
        )
    if a.pg_loss_constant_length is not None and a.pg_loss_constant_length <= 0:
        yield Problem(
            "algo.pg_loss_constant_length",
            a.pg_loss_constant_length,
            "must be > 0 tokens",
            "set it to rollout.max_response_len or null",
        )
    if a.overlong_buffer_len is not None and not 0 < a.overlong_buffer_len < cfg.rollout.max_response_len:
        yield Problem(
            "algo.overlong_buffer_len",
            a.overlong_buffer_len,
            f"must be in (0, rollout.max_response_len={cfg.rollout.max_response_len})",
            "pick a smaller window or null",
        )
    if a.eps_clip <= 0:
        yield Problem("algo.eps_clip", a.eps_clip, "must be > 0", "set algo.eps_clip=0.2")
