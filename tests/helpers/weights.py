"""Weights seen from both ends: an engine's `/weights_checker` checksums and the trainer's, by tensor name."""

from __future__ import annotations

import torch

from slime.engine import http_client
from slime.engine.hf.weight_checker import tensor_checksum


def engine_checksums(url: str) -> dict[str, str]:
    """TP rank 0's checksum per tensor (POST /weights_checker {"action": "checksum"})."""
    reply = http_client.post(url + "/weights_checker", {"action": "checksum"}, timeout=120)
    return reply["ranks"][0]["checksums"]


def trainer_checksums(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, str]:
    """The same checksum of each of `model`'s parameters (cast to `dtype`, the engine's, when given)."""
    return {name: tensor_checksum(p if dtype is None else p.to(dtype)) for name, p in model.named_parameters()}
