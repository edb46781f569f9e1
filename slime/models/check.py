"""Validation of the model options against their families (slime.models.families): `model.architecture` names a
family, the option's fields are the family's (`check_model`), its routers and latent attention are set where the
family has them (slime.models.check_shape): the family record's check, `check_family`; and a distillation teacher
has the policy's architecture (its log-probs are read token for token, and the megatron backend loads it into the
policy's structure). slime/plan/validate.py runs `check_models` after the schema's own rules."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem, one_of
from slime.config.schema import RunConfig
from slime.models.check_shape import check_model_shape
from slime.models.families import CHECKED, FAMILIES, check_model


def check_models(cfg: RunConfig) -> Iterator[Problem]:
    """`model.architecture` names a family, and the teacher has the policy's architecture (the chosen family's
    record runs `check_family`)."""
    yield from one_of("model.architecture", cfg.model.architecture, FAMILIES)
    yield from _check_teacher(cfg)


def check_family(cfg: RunConfig) -> Iterator[Problem]:
    """The check of every family's record (slime/models/spec.py): the model option against its family."""
    yield from check_model(cfg.model)
    yield from check_model_shape(cfg.model)


def _check_teacher(cfg: RunConfig) -> Iterator[Problem]:
    teacher = cfg.teacher
    if teacher is None:
        return
    for name in CHECKED:
        ours, theirs = getattr(cfg.model, name), getattr(teacher, name)
        if ours != theirs:
            yield Problem(
                f"teacher.{name}",
                theirs,
                f"the teacher ({teacher.name}) must have the policy's architecture; model.{name}={ours!r}",
                f"pick a teacher of the policy's architecture ({cfg.model.architecture}, {cfg.model.num_layers} layers)",
            )
