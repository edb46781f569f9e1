"""On-policy distillation in the trainer (algo.use_opd with model@teacher): the teacher's log-probs are the
teacher's own, on both backends, and every token's advantage is its estimator advantage minus opd_kl_coef × the
reverse KL estimate ℓ_student − ℓ_teacher (slime's apply_opd_kl_to_advantages)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime.algo.advantages import distillation_advantages
from slime.assets.tiny_model import create_tiny_model
from slime.config.schema import AlgoConfig
from slime.net import free_port
from slime.train.layout import RankLayout
from slime.train.token_advantages import compute_advantages
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout

F64 = dict(dtype=torch.float64)


def test_distillation_advantages_subtract_the_reverse_kl():
    student, teacher = torch.tensor([-1.0, -2.0, -0.5], **F64), torch.tensor([-1.5, -0.5, -0.5], **F64)
    advantages, reverse_kl = distillation_advantages(
        torch.tensor([1.0, 1.0, -1.0], **F64), student, teacher, kl_coef=0.5
    )
    torch.testing.assert_close(reverse_kl, torch.tensor([0.5, -1.5, 0.0], **F64))
    torch.testing.assert_close(advantages, torch.tensor([0.75, 1.75, -1.0], **F64))


def test_distillation_shapes_advantages_before_whitening():
    """GRPO's broadcast advantages [1, 1 | −1] minus 2·[0.5, −0.5 | 0.25], then whitened over the step."""
    algo = AlgoConfig(name="grpo", use_opd=True, opd_kl_coef=2.0, normalize_advantages=True)
    student = torch.tensor([-1.0, -1.0, -1.0], **F64)
    teacher = torch.tensor([-1.5, -0.5, -1.25], **F64)
    advantages, _, _ = compute_advantages(
        algo,
        rewards=torch.tensor([1.0, -1.0], **F64),
        response_lengths=[2, 1],
        loss_mask=torch.ones(3, **F64),
        old_log_probs=student,
        ref_log_probs=None,
        values=None,
        all_reduce=None,
        teacher_log_probs=teacher,
    )
    shaped = torch.tensor([0.0, 2.0, -1.5], **F64)
    whitened = (shaped - shaped.mean()) / torch.sqrt(shaped.var() + 1e-8)
    torch.testing.assert_close(advantages, whitened)
    with pytest.raises(ValueError, match="teacher's log-probs"):
        compute_advantages(
            algo,
            rewards=torch.tensor([1.0], **F64),
            response_lengths=[1],
            loss_mask=torch.ones(1, **F64),
            old_log_probs=student[:1],
            ref_log_probs=None,
            values=None,
            all_reduce=None,
        )


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """model=tiny_qwen3_teacher's checkpoint, made here."""
    teacher = typed_config(["model=tiny_qwen3_teacher"]).model
    path = str(tmp_path_factory.mktemp("teacher") / "tiny_qwen3_teacher")
    return str(create_tiny_model(dataclasses.replace(teacher, hf_checkpoint=path, generate_at=path)))


def distilling(model_dir: str, teacher_dir: str, *extra: str):
    return make_setup(
        model_dir,
        [
            "algo.use_opd=true",
            "algo.opd_kl_coef=0.5",
            "model@teacher=tiny_qwen3_teacher",
            f"teacher.hf_checkpoint={teacher_dir}",
            *extra,
        ],
    )


def megatron_rollout(setup, batch):
    pytest.importorskip("megatron.core")
    from slime.train.megatron import parallel
    from slime.train.megatron.backend import MegatronBackend

    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    backend.init()
    try:
        train_rollout(backend, batch)
        return {k: v.clone() for k, v in backend.columns.items()}
    finally:
        parallel.destroy()


def test_both_backends_score_with_the_teacher_and_shape_the_advantages(tiny_model_dir, teacher_dir):
    batch = batches_for(make_samples(8, seed=11), dp=1, k=1)[0]
    setup = distilling(tiny_model_dir, teacher_dir)
    assert setup.frozen_checkpoints == {"teacher": teacher_dir}
    fsdp = make_backend(setup)
    result = train_rollout(fsdp, batch)
    columns = fsdp.columns
    # the teacher column is the teacher's own forward: a backend whose policy is the teacher scores the same
    teacher_as_policy = make_backend(make_setup(teacher_dir))
    teacher_as_policy.load_batch(0, batch)
    teacher_as_policy.compute_log_probs("old")
    torch.testing.assert_close(
        columns["teacher_log_probs"], teacher_as_policy.columns["old_log_probs"], rtol=0, atol=1e-6
    )
    # and it is not the student: on a peaked random teacher the reverse KL is large
    reverse_kl = columns["old_log_probs"] - columns["teacher_log_probs"]
    torch.testing.assert_close(columns["opd_reverse_kl"], reverse_kl)
    assert reverse_kl.mean() > 1.0
    grpo = make_backend(make_setup(tiny_model_dir))
    train_rollout(grpo, batch)
    torch.testing.assert_close(columns["advantages"], grpo.columns["advantages"] - 0.5 * reverse_kl, rtol=0, atol=1e-6)
    assert result["rollout"]["rollout/opd_reverse_kl"] > 1.0
    assert result["steps"][0]["train/opd_reverse_kl"] == pytest.approx(
        result["rollout"]["rollout/opd_reverse_kl"], rel=1e-5
    )
    # the megatron backend swaps the teacher's weights in for its forward, and out again
    megatron = megatron_rollout(distilling(tiny_model_dir, teacher_dir, "parallelism=megatron"), batch)
    for name in ("teacher_log_probs", "old_log_probs", "advantages"):
        torch.testing.assert_close(megatron[name], columns[name], rtol=0, atol=2e-5)
