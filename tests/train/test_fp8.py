"""parallelism.fp8 on the fsdp backend: torchao's float8 training of the decoder layers' linears (emulated on a CPU:
the same casts and scales in high precision), the packed micro-batches padded to float8's multiple of 16 tokens,
and the configurations it refuses before anything starts."""

from __future__ import annotations

import importlib.util

import torch

from slime.plan.validate import validate
from slime.train import packing
from slime.train.fsdp.float8 import FLOAT8_MULTIPLE
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, log_probs, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.validation import config_problems

_find = importlib.util.find_spec
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
PROJECTIONS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def test_a_packed_stream_is_padded_to_the_multiple_with_a_sequence_that_scores_nothing():
    plain = packing.pack([[5, 6, 7], [8, 9]], [1, 1], torch.device("cpu"))
    padded = packing.pack([[5, 6, 7], [8, 9]], [1, 1], torch.device("cpu"), multiple_of=FLOAT8_MULTIPLE, pad_id=3)
    assert padded.input_ids.shape == (1, 16) and padded.input_ids[0, 5:].eq(3).all()
    assert padded.cu_seqlens.tolist() == [0, 3, 5, 16] and padded.position_ids[0, 5:].tolist() == list(range(11))
    assert torch.equal(padded.rows, plain.rows) and torch.equal(padded.targets, plain.targets)
    exact = packing.pack([[5] * 16], [4], torch.device("cpu"), multiple_of=FLOAT8_MULTIPLE)
    assert exact.input_ids.shape == (1, 16) and exact.cu_seqlens.tolist() == [0, 16]


def test_the_decoder_layers_linears_train_in_float8_and_export_the_weights_of_a_plain_run(tiny_model_dir, torchao_site):
    """Every projection of every decoder layer is torchao's Float8Linear (embeddings, norms and the LM head are not);
    the exported weights keep their names and dtype; the log-probs are float8's rounding away from the plain run's
    (measured on the tiny model: mean 0.056, max 0.16) and a training step on them moves the weights."""
    samples = make_samples(8, seed=3)
    batch = batches_for(samples, dp=1, k=1)[0]
    plain = make_backend(make_setup(tiny_model_dir))
    reference = log_probs(plain, batch).clone()
    plain_export = {name: t.dtype for bucket in plain.export_weights(1 << 20) for name, t in bucket}
    plain.shutdown()

    backend = make_backend(make_setup(tiny_model_dir, ["parallelism.fp8=true", "train.lr=1e-2"]))
    converted = {name for name, m in backend.model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == {f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS}
    before = {name: t.clone() for bucket in backend.export_weights(1 << 20) for name, t in bucket}
    assert {name: t.dtype for name, t in before.items()} == plain_export
    ours = log_probs(backend, batch)
    diff = (ours - reference).abs()
    assert 0 < diff.mean() < 0.1 and diff.max() < 0.5, (diff.mean(), diff.max())

    backend.load_batch(0, batch)
    assert backend._pack(list(range(len(batch)))).input_ids.shape[1] % FLOAT8_MULTIPLE == 0
    result = train_rollout(backend, batch)
    after = {name: t for bucket in backend.export_weights(1 << 20) for name, t in bucket}
    assert all(torch.isfinite(t).all() for t in after.values())
    moved = [n for n in converted if not torch.equal(after[f"{n}.weight"], before[f"{n}.weight"])]
    assert sorted(moved) == sorted(converted), result
    backend.shutdown()


def test_fp8_is_refused_where_it_cannot_run(torchao_site):
    """Before anything starts: megatron (its FP8 is Transformer Engine's), LoRA, MoE experts; a dense fsdp run is
    valid."""
    megatron = config_problems(["parallelism=megatron", "parallelism.fp8=true"])
    assert "Transformer Engine" in megatron["parallelism.fp8"], megatron
    for override, words in (
        ("model.lora.rank=4", "LoRA adapters over a float8 base"),
        ("model=tiny_qwen3_moe", "MoE model's experts"),
    ):
        problems = config_problems(["parallelism.fp8=true", override])
        assert words in problems.get("parallelism.fp8", ""), (override, problems)
    assert validate(typed_config(["parallelism.fp8=true"])).dp_size == 1


def test_fp8_without_torchao_names_the_extra(monkeypatch):
    """Where torchao is not importable (this environment's own site-packages lacks it), validation says how to
    install it."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else _find(name, *a))
    problems = config_problems(["parallelism.fp8=true"])
    assert "torchao is not installed" in problems["parallelism.fp8"] and ".[fp8]" in problems["parallelism.fp8"]
