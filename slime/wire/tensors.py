"""Tensors on the wire: a bucket of (HF name, tensor), dtype names both sides parse, byte counts, and the named
views of a flat byte buffer.

    Bucket = [(HF name, tensor), ...]     what `TrainBackend.export_weights` yields and every sync mode moves
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

Bucket = list[tuple[str, torch.Tensor]]

DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    name = str(name).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {sorted(DTYPES)}")
    return DTYPES[name]


def in_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Group (HF name, tensor) pairs, in order, into buckets of at least `bucket_bytes` (the last may be smaller).

    The input is consumed lazily, so an exporter whose tensors come from collectives gathers one bucket at a time.
    """
    bucket: Bucket = []
    size = 0
    for name, tensor in named_tensors:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def sha256(tensor: torch.Tensor) -> str:
    """The sha256 of a tensor's bytes, as SGLang checks an adapter it loads (`expected_checksums`,
    `tp_worker.py:load_lora_adapter_from_tensors`: detached, on the CPU, contiguous, flattened to uint8)."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()).hexdigest()


def weight_checksum(tensor: torch.Tensor) -> str:
    """SGLang's `/weights_checker` checksum text of one tensor held on the CPU (`sglang/srt/utils/weight_checker.py:
    _hash_tensor` over `managers/mm_utils.py:tensor_hash`'s CPU path): the first 8 bytes of the sha256 of its bytes,
    big-endian, as 16 hex digits. SGLang hashes a GPU tensor with a hash of its own instead."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.sha256(memoryview(flat.numpy())).digest()
    return f"{int.from_bytes(digest[:8], byteorder='big', signed=False):016x}"


def bucket_nbytes(bucket: Sequence[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


def unflatten(buffer: torch.Tensor, metadata: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Views of `buffer` as the named tensors (the caller copies them before the buffer goes away)."""
    out = {}
    for m in metadata:
        if not 0 <= m["start"] <= m["end"] <= buffer.numel():
            raise ValueError(
                f"tensor {m['name']!r}: bytes {m['start']}..{m['end']} outside the {buffer.numel()}-byte buffer"
            )
        out[m["name"]] = buffer[m["start"] : m["end"]].view(parse_dtype(m["dtype"])).reshape(m["shape"])
    return out
