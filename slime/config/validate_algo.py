"""Algorithm knobs the schema alone decides: mutually exclusive options, reference models, ranges. What the
chosen estimator needs is its record's check (slime/algo/check.py)."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig


def check_algo(cfg: RunConfig) -> Iterator[Problem]:
    """The `algo.*` knobs: KL, engine log-probs, ranges."""
    yield from _check_kl(cfg)
    yield from _check_log_probs(cfg)
    yield from _check_distillation(cfg)
    yield from _check_routing_replay(cfg)
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
    if a.kl_coef != 0 and cfg.checkpoint.ref_load is None:
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            "KL in the reward needs a reference model but checkpoint.ref_load is null",
            "set checkpoint.ref_load=<HF dir of the reference model>",
        )


def _check_log_probs(cfg: RunConfig) -> Iterator[Problem]:
    """Engine log-probs are either ℓ_old (use_rollout_logprobs) or TIS's denominator, not both; a TIS level needs TIS."""
    a = cfg.algo
    if a.use_tis and a.use_rollout_logprobs:
        yield Problem(
            "algo.use_tis",
            True,
            "TIS and algo.use_rollout_logprobs are mutually exclusive",
            "set algo.use_tis=false or algo.use_rollout_logprobs=false",
        )
    if a.tis_level != "token" and not a.use_tis:
        yield Problem(
            "algo.tis_level",
            a.tis_level,
            "the TIS level shapes importance weights, and algo.use_tis is false",
            "set algo.use_tis=true, or leave algo.tis_level=token",
        )


def _check_distillation(cfg: RunConfig) -> Iterator[Problem]:
    """On-policy distillation and its teacher come together (the teacher's architecture: slime.models.check)."""
    a, teacher = cfg.algo, cfg.teacher
    if a.use_opd and teacher is None:
        yield Problem(
            "algo.use_opd",
            True,
            "on-policy distillation needs a teacher, and none is chosen",
            "pick one with model@teacher=OPTION (e.g. model@teacher=tiny_qwen3_teacher; "
            "teacher.hf_checkpoint=<HF dir> points an option at your own checkpoint)",
        )
    if teacher is not None and not a.use_opd:
        yield Problem(
            "teacher",
            teacher.name,
            "only on-policy distillation reads a teacher, and algo.use_opd is false",
            "set algo.use_opd=true, or drop model@teacher",
        )
    if a.use_opd and not a.opd_kl_coef > 0:
        yield Problem("algo.opd_kl_coef", a.opd_kl_coef, "must be > 0", "set algo.opd_kl_coef=1.0 (slime's default)")


def _check_routing_replay(cfg: RunConfig) -> Iterator[Problem]:
    """A known replay mode, on an MoE policy."""
    value, mode = cfg.algo.routing_replay, RoutingReplay.named(cfg.algo.routing_replay)
    if mode is None:
        modes = [m.value for m in RoutingReplay]
        yield Problem("algo.routing_replay", value, f"is not one of {modes}", "set algo.routing_replay=none")
        return
    if mode.replays and not cfg.model.num_experts:
        yield Problem(
            "algo.routing_replay",
            value,
            f"replays MoE routing, but model {cfg.model.name} is dense (model.num_experts is null)",
            "set algo.routing_replay=none, or pick an MoE model (e.g. model=tiny_qwen3_moe)",
        )
    if mode.trainer_records_routes and cfg.algo.use_rollout_logprobs:
        yield Problem(
            "algo.routing_replay",
            value,
            "records the routes of the policy's log-prob pass, and algo.use_rollout_logprobs skips that pass",
            "set algo.routing_replay=rollout (the engine's routes), or algo.use_rollout_logprobs=false",
        )


def _check_ranges(cfg: RunConfig) -> Iterator[Problem]:
    """Numeric ranges of the clipping and length knobs."""
    a = cfg.algo
    if a.eps_clip_c is not None and a.eps_clip_c <= 1:
        yield Problem(
            "algo.eps_clip_c", a.eps_clip_c, "the dual-clip constant must be > 1", "set algo.eps_clip_c=3.0 or null"
        )
    if a.opsm_delta < 0:
        yield Problem(
            "algo.opsm_delta", a.opsm_delta, "must be >= 0 nats", "set algo.opsm_delta=1.0e-4 (slime's default)"
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
