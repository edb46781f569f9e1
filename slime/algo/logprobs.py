"""Token log-probs and entropy from logits (docs/algorithms.md#log-probs-and-the-reuse-rule).

Alignment: the logits at sequence position i predict token i+1. For a sequence of
P prompt tokens followed by R response tokens, response token j (0-based, absolute
position P+j) is scored by the logits at position P−1+j, i.e. rows
``logits[response_logits_slice(P, R)]`` pair with targets ``tokens[P : P+R]``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def response_logits_slice(prompt_length: int, response_length: int) -> slice:
    """Rows of a [P+R, V] logits tensor that score the R response tokens: [P−1, P−1+R)."""
    if prompt_length < 1:
        raise ValueError(
            f"prompt_length must be >= 1 (the first response token needs a predecessor), got {prompt_length}"
        )
    if response_length < 0:
        raise ValueError(f"response_length must be >= 0, got {response_length}")
    return slice(prompt_length - 1, prompt_length - 1 + response_length)


def log_probs_and_entropy(
    logits: Tensor,
    target_ids: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target under softmax(logits / T), and optionally the entropy.

    Computed in float32 at least (bf16/fp16 are upcast; fp64 stays fp64).

    Args:
        logits: Tensor[S, V], already aligned with the targets (see module docstring).
        target_ids: Tensor[S] of int64 token ids.
        temperature: T > 0, the rollout sampling temperature.
        with_entropy: also return H = logsumexp(z/T) − Σ_v softmax(z/T)_v·z_v/T.

    Returns:
        (log_probs Tensor[S] in nats, entropy Tensor[S] in nats or None), in the compute dtype.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dim() != 2 or target_ids.dim() != 1 or logits.shape[0] != target_ids.shape[0]:
        raise ValueError(
            f"expected logits [S, V] and target_ids [S], got {tuple(logits.shape)} and {tuple(target_ids.shape)}"
        )
    dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    z = logits.to(dtype) / temperature
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return log_probs, None
    probs = torch.softmax(z, dim=-1)
    entropy = lse - (probs * z).sum(dim=-1)
    return log_probs, entropy


@functools.cache
def _compiled_chunk():
    """`_chunk` compiled for CUDA: the fp32 [rows, V] logits go through a few fused kernels instead of one
    kernel (and one full read and write) per elementwise op; dynamic shapes, one graph for every chunk."""
    return torch.compile(_chunk, dynamic=True)


def _chunk(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float, with_entropy: bool
) -> Tensor:
    log_probs, entropy = log_probs_and_entropy(
        F.linear(hidden, weight, bias), targets, temperature=temperature, with_entropy=with_entropy
    )
    return log_probs.unsqueeze(-1) if entropy is None else torch.stack([log_probs, entropy], dim=-1)


def chunked_log_probs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target_ids: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """`log_probs_and_entropy(hidden @ weight.T + bias, ...)` computed `chunk_size` rows at a time, so the
    logits of at most `chunk_size` tokens (Tensor[chunk_size, V], fp32) exist at once.

    With gradients enabled each chunk is checkpointed: the backward recomputes one chunk's logits at a
    time instead of keeping every chunk's alive; the gradients equal the unchunked ones.

    Args:
        hidden: Tensor[S, H], the LM head's inputs already aligned with the targets.
        weight: Tensor[V, H] and bias: Tensor[V] or None, the LM head.
        target_ids: Tensor[S] int64; temperature, with_entropy: as in `log_probs_and_entropy`.

    Returns:
        (log_probs Tensor[S] in nats, entropy Tensor[S] in nats or None), float32 (fp64 stays fp64).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    track = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    parts = []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (
            hidden[start : start + chunk_size],
            weight,
            bias,
            target_ids[start : start + chunk_size],
            temperature,
            with_entropy,
        )
        chunk = _compiled_chunk() if hidden.is_cuda else _chunk
        parts.append(checkpoint(chunk, *args, use_reentrant=False) if track else chunk(*args))
    if not parts:  # no rows: empty outputs of the right dtype
        parts.append(_chunk(hidden, weight, bias, target_ids, temperature, with_entropy))
    out = torch.cat(parts)
    return out[:, 0], (out[:, 1] if with_entropy else None)
