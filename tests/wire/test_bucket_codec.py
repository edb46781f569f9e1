"""A bucket flattened into its byte buffer and read back as views: every tensor's bits, whatever its dtype, shape or
layout, and an empty bucket (a TP rank with nothing to load)."""

from __future__ import annotations

import torch

from slime.wire.bucket_codec import bucket_metadata, flatten, reconstruct


def test_a_flattened_bucket_reads_back_every_tensor_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    bucket = [
        ("a.weight", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("b.bias", torch.randn(7, generator=gen)),  # fp32 after an odd count of bf16 bytes: aligned to 4
        ("c.weight", torch.randn(4, 6, generator=gen).to(torch.bfloat16).t()),  # not contiguous
        ("d.scale", torch.tensor(2.5, dtype=torch.float16)),  # 0-dim
        ("e.mask", torch.tensor([True, False, True])),
    ]
    metadata = bucket_metadata(bucket)
    flat = torch.zeros(metadata[-1].end_idx, dtype=torch.uint8)
    flatten(bucket, flat, metadata)
    back = reconstruct(flat, metadata)
    assert [name for name, _ in back] == [name for name, _ in bucket]
    for (_, want), (_, got) in zip(bucket, back):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    assert metadata[1].start_idx % 4 == 0


def test_an_empty_bucket_flattens_to_nothing():
    flat = torch.empty(0, dtype=torch.uint8)
    flatten([], flat, [])
    assert reconstruct(flat, []) == []
