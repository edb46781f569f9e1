"""Whether a round trip through the checkpoint converters gave the same HF checkpoint back (tests/train/megatron:
the tiny families and SmolLM2)."""

from __future__ import annotations

import torch

from slime.train.megatron.weights.hf_reader import HFReader


def assert_same_checkpoint(original, converted) -> None:
    a, b = HFReader(original), HFReader(converted)
    assert a.names() == b.names()
    for name in a.names():
        left, right = a.get(name), b.get(name)
        assert left.dtype == right.dtype and torch.equal(left, right), name
    assert (converted / "config.json").read_text() == (original / "config.json").read_text()
    assert (converted / "tokenizer.json").exists()
