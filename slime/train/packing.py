"""Packed micro-batches: the samples of one micro-batch as a single [1, T] stream
(docs/architecture.md#packed-micro-batches).

Samples are concatenated without padding, positions restart at 0 for each sample, and attention runs
per sample over `cu_seqlens`, so no token ever attends to another sample's tokens and the results equal
the unpacked computation. The attention is registered with transformers' `AttentionInterface` under
`ATTN_IMPLEMENTATION`; transformers builds no mask for an implementation it has no mask function for,
and forwards the model's `cu_seq_lens_q/k` and `max_length_q/k` kwargs (its FlashAttention kwargs) to
every attention call.

On CUDA in bf16/fp16 the attention is torch's `varlen_attn` (FlashAttention varlen) when this torch
has it; elsewhere (CPU, fp32) it is one causal SDPA call per sample: exact, needs no extra package.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from slime.algo.logprobs import chunked_log_probs_and_entropy
from slime.vision.sequence import images_at

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # a torch without FlashAttention varlen
    varlen_attn = None

ATTN_IMPLEMENTATION = "slime_varlen"


@dataclass
class Packed:
    """One packed micro-batch.

    input_ids / position_ids: Tensor[1, T] int64, T = the samples' total token count (prompt + response);
    a vision-language model's position_ids are Tensor[3, 1, T] (slime.train.vision_batch).
    cu_seqlens: Tensor[n+1] int32, [0, L1, L1+L2, ...]; max_length: the longest sample in tokens.
    rows: Tensor[N] int64, stream positions whose outputs score the N response tokens (sample order);
    targets: Tensor[N] int64, the response token ids they score (the alignment:
    docs/algorithms.md#log-probs-and-the-reuse-rule).
    """

    input_ids: Tensor
    position_ids: Tensor
    cu_seqlens: Tensor
    max_length: int
    rows: Tensor
    targets: Tensor
    extra: dict = field(default_factory=dict)  # further forward inputs: a vision-language model's pixels
    image_mask: Tensor | None = None  # Tensor[T] bool: the stream positions its images fill (`images_at`)

    def model_kwargs(self) -> dict:
        """Keyword arguments for a transformers model's forward (attention_mask stays None)."""
        return {
            **self.extra,
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "use_cache": False,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def pack(
    token_lists: list[list[int]],
    response_lengths: list[int],
    device: torch.device,
    *,
    multiple_of: int = 1,
    pad_id: int = 0,
) -> Packed:
    """Concatenate samples (ragged token ids, each with `response_lengths[i]` ≥ 0 trailing response
    tokens and a prompt of ≥ 1 token) into one packed stream on `device`. With `multiple_of` > 1 a sequence of
    `pad_id` tokens, scoring nothing, fills the stream up to a multiple of that many tokens (float8 matmuls need
    every dimension a multiple of 16)."""
    extra = -sum(len(t) for t in token_lists) % multiple_of
    if extra:
        token_lists, response_lengths = [*token_lists, [pad_id] * extra], [*response_lengths, 0]
    ids, positions, rows, targets, cu = [], [], [], [], [0]
    for tokens, response in zip(token_lists, response_lengths):
        start, length = cu[-1], len(tokens)
        prompt = length - response
        if prompt < 1:
            raise ValueError(
                f"a sample needs at least one prompt token before its response; got length {length}, "
                f"response {response}"
            )
        ids.extend(tokens)
        positions.extend(range(length))
        rows.extend(range(start + prompt - 1, start + length - 1))
        targets.extend(tokens[prompt:])
        cu.append(start + length)
    ids_, positions_, rows_, targets_ = (
        torch.tensor(v, dtype=torch.long).to(device) for v in (ids, positions, rows, targets)
    )
    return Packed(
        input_ids=ids_.unsqueeze(0),
        position_ids=positions_.unsqueeze(0),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32).to(device),
        max_length=max(len(t) for t in token_lists),
        rows=rows_,
        targets=targets_,
    )


@functools.cache
def _varlen_kernel() -> tuple[Callable | None, bool]:
    """(torch's `varlen_attn` or None when this torch has none, whether it takes `enable_gqa`)."""
    if varlen_attn is None:
        return None, False
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


def _half_dtype(query: Tensor) -> torch.dtype | None:
    """The 16-bit dtype the attention computes in on CUDA: the inputs' own, or autocast's (which hands
    attention fp32 inputs); None for fp32 compute."""
    if not query.is_cuda:
        return None
    if query.dtype in (torch.float16, torch.bfloat16):
        return query.dtype
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None


def _varlen(query: Tensor, key: Tensor, value: Tensor, kwargs: dict, scaling: float | None, dtype) -> Tensor | None:
    """FlashAttention varlen over the packed stream (Tensor[1, T, Hq, D] in `dtype`), or None when this
    torch has no such kernel."""
    kernel, takes_gqa = _varlen_kernel()
    if kernel is None:
        return None
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))  # [T, H, D]
    repeat = q.shape[1] // k.shape[1]
    extra = {}
    if repeat > 1 and takes_gqa:
        extra["enable_gqa"] = True
    elif repeat > 1:  # older torch: K/V heads repeated to the query heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    cu, length = kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"])
    return kernel(q, k, v, cu, cu, length, length, scale=scaling, window_size=(-1, 0), **extra).unsqueeze(0)


def varlen_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, None]:
    """Causal attention within each packed sample (transformers' attention-function contract).

    query: Tensor[1, Hq, T, D]; key, value: Tensor[1, Hkv, T, D]; kwargs carry `cu_seq_lens_q`
    (Tensor[n+1] int32) and `max_length_q`. Returns (Tensor[1, T, Hq, D], None).
    """
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1:
        raise ValueError(
            f"{ATTN_IMPLEMENTATION} attention runs packed [1, T] streams only: pass cu_seq_lens_q "
            "(slime.train.packing.Packed.model_kwargs)"
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(f"{ATTN_IMPLEMENTATION} attention has no sliding window")
    gqa = query.shape[1] != key.shape[1]
    dropout = dropout if module.training else 0.0
    dtype = _half_dtype(query)
    if dtype is not None and dropout == 0.0:
        out = _varlen(query, key, value, kwargs, scaling, dtype)
        if out is not None:
            return out, None
    bounds = cu.tolist()
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            dropout_p=dropout,
            scale=scaling,
            is_causal=True,
            enable_gqa=gqa,
        )
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def log_probs_and_entropy(
    model: torch.nn.Module, packed: Packed, *, temperature: float, with_entropy: bool, chunk_size: int
) -> tuple[Tensor, Tensor | None]:
    """(log_probs Tensor[N], entropy Tensor[N] | None) in nats of the N response tokens of `packed`, from one
    forward of a transformers causal LM; grad if enabled.

    The LM head runs inside the model's forward (so FSDP2 holds its weight unsharded there, as for a plain
    forward) on the response rows only, `chunk_size` rows at a time: the fp32 logits of the whole
    micro-batch never exist.
    """
    head = model.get_output_embeddings()

    def scored(hidden: Tensor) -> Tensor:  # Tensor[1, T, H] -> Tensor[1, N, 2]
        log_probs, entropy = chunked_log_probs_and_entropy(
            hidden[0, packed.rows],
            head.weight,
            head.bias,
            packed.targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_size=chunk_size,
        )
        return torch.stack([log_probs, log_probs if entropy is None else entropy], dim=-1).unsqueeze(0)

    head.forward = scored  # an instance attribute shadows Linear.forward for this call only
    try:
        with images_at(model, packed.image_mask):
            out = model(**packed.model_kwargs()).logits[0]
    finally:
        del head.forward
    return out[:, 0], (out[:, 1] if with_entropy else None)


def register() -> str:
    """Register the packed attention with transformers (idempotent); returns its `attn_implementation`."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention)
    return ATTN_IMPLEMENTATION
