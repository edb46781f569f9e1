"""A process's random generators (Python, NumPy, torch CPU and CUDA) as a checkpoint holds them, in types
`torch.load(..., weights_only=True)` reads back."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    """This process's Python, NumPy and torch (CPU, CUDA) generators, in types `weights_only` loads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "random": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    if "random" in rng:  # checkpoints of earlier versions hold torch's only
        random.setstate(rng["random"])
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
