"""`PackedAttention`: the core attention of the megatron layer spec for packed (THD) micro-batches.

megatron's SelfAttention hands it q [t, hq, d] and k, v [t, hkv, d] of the packed stream (after the
q/k norms) plus the micro-batch's `PackedParams` (`slime.train.megatron.batch`): `cu_seqlens_q` are the
full (padded) sample boundaries, and its RoPE tables, built once per micro-batch, are applied here to q
and k (the GPTModel itself has no RoPE: `slime.train.megatron.rope`). Attention is causal within each
sample only; the [t, t] score matrix of megatron's local spec never exists.

Context parallel (zigzag, docs/architecture.md#packed-micro-batches): each sample of padded length L is cut into
2·cp chunks of c = L/(2cp) tokens and CP rank r holds chunks r and 2cp−1−r. K and V are all-gathered over the CP
group (backward: reduce-scatter), and query chunk j attends to the sample's first (j+1)·c keys: a
causal block aligned to the bottom right.

Kernels: torch's `varlen_attn` (FlashAttention varlen, `window_size=(-1, 0)` = causal, bottom-right
aligned) on CUDA in bf16/fp16; per-segment SDPA elsewhere (CPU, fp32). K/V heads are repeated for GQA.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from slime.train.megatron import rope

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # a torch without FlashAttention varlen
    varlen_attn = None
import torch.distributed.nn.functional as dist_fn
from megatron.core import parallel_state as ps


@dataclass(frozen=True)
class Segments:
    """Query segments of the local stream and the key range each attends to (bottom-right causal).

    q_bounds[i]: (start, end) rows of the local q; k_bounds[i]: (start, end) rows of the (gathered) K/V.
    """

    q_bounds: list[tuple[int, int]]
    k_bounds: list[tuple[int, int]]


def segments(cu_seqlens: list[int], cp: int, cp_rank: int) -> Segments:
    """The local query segments for full (padded) sample boundaries `cu_seqlens` under zigzag CP.

    With cp == 1 each sample is one segment attending to itself. With cp > 1 the gathered K/V is laid
    out rank after rank ([rank 0's local stream, rank 1's, ...]); key ranges are given in that layout
    only through `gather_order`, so here keys index the reassembled (original order) stream.
    """
    q, k = [], []
    for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        length = e - s
        if cp == 1:
            q.append((s, e))
            k.append((s, e))
            continue
        c = length // (2 * cp)
        local = s // cp  # the sample's first row in this rank's local stream
        for n, j in enumerate((cp_rank, 2 * cp - 1 - cp_rank)):
            q.append((local + n * c, local + (n + 1) * c))
            k.append((s, s + (j + 1) * c))
    return Segments(q, k)


def reassemble(gathered: list[Tensor], cu_seqlens: list[int], cp: int) -> Tensor:
    """The original-order stream from every CP rank's local zigzag stream (each [t/cp, ...])."""
    parts = []
    for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        c = (e - s) // (2 * cp)
        local = s // cp
        for j in range(2 * cp):
            rank, n = (j, 0) if j < cp else (2 * cp - 1 - j, 1)
            parts.append(gathered[rank][local + n * c : local + (n + 1) * c])
    return torch.cat(parts)


def _gather_cp(t: Tensor, group, cp: int, cu: list[int]) -> Tensor:
    return reassemble(list(dist_fn.all_gather(t.contiguous(), group=group)), cu, cp)


def attend(q: Tensor, k: Tensor, v: Tensor, seg: Segments, *, scale: float) -> Tensor:
    """Causal attention per segment: q [t, hq, d], k/v [tk, hkv, d] -> [t, hq, d]."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        if varlen_attn is not None:
            return _varlen(varlen_attn, q, k, v, seg, scale)
    outs = []
    for (qs, qe), (ks, ke) in zip(seg.q_bounds, seg.k_bounds):
        qi, ki, vi = (x.transpose(0, 1) for x in (q[qs:qe], k[ks:ke], v[ks:ke]))  # [h, n, d]
        nq, nk = qe - qs, ke - ks
        if nq == nk:
            out = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale)
        else:  # bottom-right aligned causal block: query i sees keys <= nk - nq + i
            mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
            out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def _varlen(kernel, q: Tensor, k: Tensor, v: Tensor, seg: Segments, scale: float) -> Tensor:
    same = seg.q_bounds == seg.k_bounds
    if not same:  # CP: each query segment's key prefix, concatenated
        k = torch.cat([k[s:e] for s, e in seg.k_bounds])
        v = torch.cat([v[s:e] for s, e in seg.k_bounds])
    cu_q = _cu([e - s for s, e in seg.q_bounds], q.device)
    cu_k = cu_q if same else _cu([e - s for s, e in seg.k_bounds], q.device)
    max_q = max(e - s for s, e in seg.q_bounds)
    max_k = max(e - s for s, e in seg.k_bounds)
    return kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(-1, 0))


def _varlen_packed(kernel, native_gqa: bool, q: Tensor, k: Tensor, v: Tensor, params, scale: float) -> Tensor:
    """One varlen call over the whole packed stream (no context parallel): causal per sample; GQA
    natively where this torch's varlen_attn takes `enable_gqa`, else with K/V heads repeated."""
    groups = q.shape[1] // k.shape[1]
    gqa = {}
    if groups > 1 and native_gqa:
        gqa = {"enable_gqa": True}
    elif groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu, longest = params.cu_seqlens_q, params.max_seqlen_q
    return kernel(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(-1, 0), **gqa)


@functools.cache
def _takes_gqa(kernel) -> bool:
    return "enable_gqa" in inspect.signature(kernel).parameters


def _cu(lengths: list[int], device) -> Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return out.to(device)


class PackedAttention(torch.nn.Module):
    """Drop-in for megatron's core attention (same constructor and forward arguments); THD only."""

    rotates = True  # applies the micro-batch's RoPE tables to q and k

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **kwargs):
        super().__init__()
        self.config = config
        self.scale = kwargs.get("softmax_scale") or config.kv_channels**-0.5
        pg = kwargs.get("pg_collection")
        self.cp_group = getattr(pg, "cp", None) if pg is not None else None
        # looked up once here, not per call (a compiled layer then traces no signature check)
        self.kernel = varlen_attn
        self.native_gqa = self.kernel is not None and _takes_gqa(self.kernel)

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        params = packed_seq_params
        if getattr(params, "qkv_format", None) != "thd" or (self.rotates and getattr(params, "rope_cos", None) is None):
            raise ValueError(
                "PackedAttention runs packed THD micro-batches with their RoPE tables only "
                "(slime.train.megatron.batch.MicroBatch.packed_seq_params)"
            )
        if self.rotates:
            interleaved = self.config.rotary_interleaved
            query = rope.apply(query, params.rope_cos, params.rope_sin, interleaved=interleaved)
            key = rope.apply(key, params.rope_cos, params.rope_sin, interleaved=interleaved)
        out = self._attend(query, key, value, params)
        return out.reshape(out.shape[0], -1)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, params) -> Tensor:
        """[t, hq, dv] from rotated q, k [t, h, d] and v [t, hkv, dv]."""
        cp = self.config.context_parallel_size
        if cp == 1 and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and self.kernel:
            return _varlen_packed(self.kernel, self.native_gqa, query, key, value, params, self.scale)  # no host sync
        return self._per_segment(query, key, value, params)

    # a Python loop over the samples (the host cu_seqlens): never traced into a compiled layer, where every
    # new set of sample lengths would be a recompile
    @torch.compiler.disable
    def _per_segment(self, query: Tensor, key: Tensor, value: Tensor, params) -> Tensor:
        cp = self.config.context_parallel_size
        cu = list(params.host_cu_seqlens)
        if cp > 1:
            group = self.cp_group if self.cp_group is not None else _cp_group()
            rank = torch.distributed.get_rank(group)
            key, value = _gather_cp(key, group, cp, cu), _gather_cp(value, group, cp, cu)
            seg = segments(cu, cp, rank)
        else:
            seg = segments(cu, 1, 0)
        return attend(query, key, value, seg, scale=self.scale)


def _cp_group():
    return ps.get_context_parallel_group()


class PackedLatentAttention(PackedAttention):
    """The core attention behind megatron's `MultiLatentAttention`, which rotates q and k itself: q, k
    [t, h, qk_head_dim + qk_pos_emb_head_dim], v [t, h, v_head_dim], the softmax scale the layer gives. FlashAttention's
    varlen kernel takes one head size, so v is zero-padded to q's there and the output cut back (exact)."""

    rotates = False

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, params) -> Tensor:
        width = value.shape[-1]
        if width == query.shape[-1] or not query.is_cuda:
            return super()._attend(query, key, value, params)
        padded = F.pad(value, (0, query.shape[-1] - width))
        return super()._attend(query, key, padded, params)[..., :width]
