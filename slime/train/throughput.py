"""What a training step achieved: real tokens/s, model TFLOP/s per GPU and MFU (`slime.models.flops`), and the peak
GPU memory of a phase, as the `perf/*` metrics of every rollout step.

The FLOPs are those of the real (unpadded) tokens of the step's samples, the LM head counted on the response tokens
only (the rows our backends compute it for); summed over the data-parallel ranks and divided by every GPU of the
group (tp·pp·cp split one shard's FLOPs), so perf/train_tflops is the mean per GPU.
"""

from __future__ import annotations

import time

import torch

from slime.models.flops import train_flops
from slime.types import TrainBatch

CEILING_SIZE = 8192  # the square bf16 matmul whose speed is the MFU denominator, as tools/bench_train.py


def matmul_ceiling_tflops(device: torch.device) -> float | None:
    """bf16 TFLOP/s of an 8192³ matmul on this CUDA device (three warm-ups, then 20 timed); None on CPU."""
    if device.type != "cuda":
        return None
    a = torch.randn(CEILING_SIZE, CEILING_SIZE, device=device, dtype=torch.bfloat16)
    b = torch.randn(CEILING_SIZE, CEILING_SIZE, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start, iters = time.perf_counter(), 20
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    del a, b
    return 2 * CEILING_SIZE**3 * iters / seconds / 1e12


def shard_train_flops(model, batch: TrainBatch) -> float:
    """Training FLOPs of this rank's shard: every sample's real tokens once (its K optimizer steps split them)."""
    sequences = [(len(tokens), response) for tokens, response in zip(batch.tokens, batch.response_lengths)]
    return train_flops(model, sequences)


def seconds_since(start: float, device: torch.device) -> float:
    """Wall seconds from `start` (`time.perf_counter()`) until the work queued on `device` has finished: a phase's
    last kernels (the optimizer's update) still run when its Python returns, and would fall into the next phase."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def begin_phase(device: torch.device) -> None:
    """Start a phase's peak-memory window (CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device, phase: str) -> dict[str, float]:
    """{"perf/peak_gib/<phase>": the most GPU memory allocated since `begin_phase`, GiB}; {} on CPU."""
    if device.type != "cuda":
        return {}
    return {f"perf/peak_gib/{phase}": torch.cuda.max_memory_allocated(device) / 2**30}


def train_rates(totals: torch.Tensor, *, seconds: float, num_gpus: int, peak_tflops: float | None) -> dict[str, float]:
    """`totals` = [FLOPs, real tokens] of the step summed over the data-parallel ranks; `seconds` its wall time."""
    flops, tokens = (float(x) for x in totals)
    tflops = flops / (num_gpus * seconds) / 1e12
    rates = {"perf/train_tokens_per_s": tokens / seconds, "perf/train_tflops": tflops}
    if peak_tflops:
        rates["perf/mfu"] = tflops / peak_tflops
    return rates
