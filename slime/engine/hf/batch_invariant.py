"""Batch-invariant forward passes on CPU: what the hf engine runs under `rollout.deterministic` (SGLang's
`--enable-deterministic-inference`), so that a request's logits, and so its tokens and log-probs, are the same bits
whichever requests share its batch, in whatever order they came and however much left padding that puts on its row.

The method is Thinking Machines' ("Defeating Nondeterminism in LLM Inference", thinking-machines-lab/
batch_invariant_ops): every reduction a row goes through must run in an order that depends on that row alone. Their
library swaps aten's mm / addmm / log_softmax / mean for Triton kernels with fixed tiles; SGLang (`--enable-
deterministic-inference`) and vLLM (`VLLM_BATCH_INVARIANT=1`) build on it and add attention with a fixed split size.
On CPU, measured op by op against a row decoded alone (torch 2.13, MKL, one thread), three things differ and are
replaced here; the rest is already per row:

- Linear (`linear`): MKL picks its GEMM kernel by the row count (a GEMV for one row, other kernels for 2-3 rows), so
  `x[:1] @ W` and `(x @ W)[:1]` differ by ~1 ulp. Here every Linear runs as GEMMs of one fixed shape, `TILE_ROWS`
  rows (the last tile padded with zero rows): the same kernel, blocking and K-reduction order every call, and on one
  thread a row's output is the same at any position of the tile (tested; with threads MKL splits a tile's rows, and
  a split into chunks of 1-3 rows changes the kernel again). Measured for tiny_qwen3's MLP (K=64, N=192) at 256 /
  3072 rows: `F.linear` 66 / 773 us, not invariant, nor with `torch.use_deterministic_algorithms` or mkldnn off
  (run-to-run determinism, not batch invariance); fixed tiles of 64 rows 120 / 1173 us (of 16: 136 / 1694);
  one `F.linear` per row 1022 / 22258 us; mul + sum over K 623 / 117851 us; fp64 accumulation 145 / 1798 us and
  invariant only as long as no fp32 rounding falls on a tie of its own order's error; a `bmm` over the tiles 75 /
  859 us, invariant as far as its batched kernel computes each tile as a lone GEMM (a forward pass of the engine
  costs the same either way: Python, not the GEMMs, dominates there).
- Attention (`attention`, a transformers attention function): with left padding a row's keys sit at another offset
  of the padded cache, so SDPA's vectorised softmax sums and its P @ V reduction group them differently, and a
  padded batch takes the masked kernel where a lone row takes the unmasked one. Here the rows are grouped by their
  own length n and each group runs SDPA on exactly its last n keys (and queries), unmasked: the call a lone row
  makes, with only the batch dimension larger (SDPA computes each (row, head) on its own).
- Transcendental elementwise functions (`ALIGNED_FUNCTIONS`: exp, cos, sin, silu, sigmoid, ...): aten evaluates the
  vectorised form on full vectors and a scalar form on the tail of the flattened tensor; for silu and sigmoid these
  differ in the last ulp (measured: 74 of 2000 elements), and whether an element falls in the tail depends on the
  batch size. Here they run on a contiguous copy padded to a multiple of `VECTOR_ALIGN` elements, so every element
  takes the vectorised form (a copy only where the size is not already such a multiple).

Per row already: RMSNorm (a reduction over the last dimension), RoPE, embeddings, log_softmax and the sampler's
per-row ops. All of this holds on one torch thread (with more, MKL and SDPA split a call across threads by its
size); the engine runs batch-invariant decoding on one (`slime/engine/hf/check.py`).

`BatchInvariantOps(model)` is the context the generator runs forward passes in: a thread-local `TorchFunctionMode`
for the functions above, and the model's attention (and MoE experts: the eager per-expert Linears) switched to
these for its duration. `unsupported(model)` says why a model cannot run this way (not on the CPU, more than one
thread, attention outside transformers' attention functions, a sliding-window layer): the server then decodes each
request alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, prepare_padding_mask

from slime.models.hf_model import text_config

ATTENTION = "slime_batch_invariant"  # the transformers attention (and mask) implementation registered here
TILE_ROWS = 64  # rows per GEMM of a batch-invariant Linear: fewer calls for a prefill's thousands of rows than 16
VECTOR_ALIGN = 64  # elements: a multiple of aten's vectorised loop step (2 vectors of 16 floats with AVX-512)

ALIGNED_FUNCTIONS = {
    torch.exp,
    torch.Tensor.exp,
    torch.cos,
    torch.Tensor.cos,
    torch.sin,
    torch.Tensor.sin,
    torch.sigmoid,
    torch.Tensor.sigmoid,
    torch.tanh,
    torch.Tensor.tanh,
    F.silu,
    F.gelu,
    F.softplus,
}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` of x [..., K] with weight [N, K] as GEMMs of exactly [TILE_ROWS, K] x [K, N] each: a row's output
    depends on that row alone, whatever else is in the batch."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    missing = -count % TILE_ROWS
    if missing:
        rows = torch.cat([rows, rows.new_zeros(missing, rows.shape[1])])
    out = torch.cat([F.linear(tile, weight, bias) for tile in rows.split(TILE_ROWS)])
    return out[:count].view(*x.shape[:-1], weight.shape[0])


def aligned(func, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """`func(x, ...)` for an elementwise `func`, every element through aten's vectorised loop (none in its scalar
    tail): on a contiguous copy of x padded to a multiple of VECTOR_ALIGN elements."""
    if x.is_contiguous() and x.numel() % VECTOR_ALIGN == 0:
        return func(x, *args, **kwargs)
    flat = x.reshape(-1)
    padded = F.pad(flat, (0, -flat.numel() % VECTOR_ALIGN))
    return func(padded, *args, **kwargs)[: flat.numel()].view(x.shape)


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    **kwargs,
) -> torch.Tensor | None:
    """The transformers mask function of `attention`: the 2D padding mask [B, kv_length] bool (None: no padding),
    for plain causal attention only."""
    if mask_function is not causal_mask_function or local_size is not None:
        raise NotImplementedError("batch-invariant attention handles plain causal attention only")
    return prepare_padding_mask(attention_mask, kv_length, kv_offset)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention of left-padded rows, each (row, head) as SDPA computes it for that row alone.

    query [B, H, Q, D] and key / value [B, Hkv, W, D | Dv] with Q = W (a prefill) or Q = 1 (a decode step);
    `attention_mask` [B, W] bool: a row's n valid keys are its last n. Returns ([B, Q, H, Dv], None); the queries
    of padding positions get zeros.
    """
    batch, heads, q_len, _ = query.shape
    width = key.shape[2]
    if q_len not in (1, width):
        raise NotImplementedError(f"batch-invariant attention: {q_len} queries onto {width} keys")
    if attention_mask is None:
        lengths = [width] * batch
    else:
        steps = attention_mask.to(torch.int8).diff(dim=-1)
        if not bool(attention_mask[:, -1].all()) or bool((steps < 0).any()):
            raise ValueError("batch-invariant attention needs left-padded rows")
        lengths = attention_mask.sum(-1).tolist()
    if len(set(lengths)) == 1 and lengths[0] == width:  # one group of all rows, no padding: as it is
        return _sdpa(query, key, value, scaling).transpose(1, 2).contiguous(), None
    out = query.new_zeros(batch, heads, q_len, value.shape[-1])
    for n in sorted(set(lengths)):
        rows = torch.tensor([i for i, length in enumerate(lengths) if length == n], device=query.device)
        fed = min(q_len, n)
        group = (query[rows, :, q_len - fed :], key[rows, :, width - n :], value[rows, :, width - n :])
        out[rows, :, q_len - fed :] = _sdpa(*group, scaling)
    return out.transpose(1, 2).contiguous(), None


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """Unmasked SDPA of rows whose queries are their last Q positions of W = Q (causal) or Q = 1, on contiguous
    copies (one memory layout whatever the rows were sliced from). A decode step's query heads that share a key
    head go in as that head's queries (transformers' `pack_gqa`: half the time of `enable_gqa` here)."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    key, value = key.contiguous(), value.contiguous()
    if q_len == 1 and heads != kv_heads:
        packed = query.contiguous().view(batch, kv_heads, heads // kv_heads, dim)
        out = F.scaled_dot_product_attention(packed, key, value, scale=scaling)
        return out.reshape(batch, heads, 1, value.shape[-1])
    return F.scaled_dot_product_attention(
        query.contiguous(), key, value, is_causal=q_len > 1, scale=scaling, enable_gqa=heads != kv_heads
    )


AttentionInterface.register(ATTENTION, attention)
AttentionMaskInterface.register(ATTENTION, padding_mask)


def unsupported(model) -> str | None:
    """Why `model` cannot decode batch-invariant here (None: it can): it must sit on the CPU, torch must run one
    intra-op thread, its attention must go through transformers' attention functions (`attention` replaces
    them) and every layer must be plain causal full attention (no sliding window; a mask of another kind raises
    in `padding_mask`)."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        return f"batch-invariant decoding is implemented for the CPU, not {device}"
    if torch.get_num_threads() != 1:
        return f"batch-invariant decoding runs on one torch thread, not {torch.get_num_threads()}"
    if not getattr(model, "_supports_attention_backend", False):
        return f"{type(model).__name__} does not take transformers' attention functions"
    config = text_config(model.config)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"batch-invariant decoding handles full-attention layers only, not {sorted(types)}"
    return None


class _Functions(TorchFunctionMode):
    """The torch functions replaced while the mode is on (this thread only)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return linear(*args, **kwargs)
        if func in ALIGNED_FUNCTIONS:
            return aligned(func, *args, **kwargs)
        return func(*args, **kwargs)


class BatchInvariantOps:
    """`with BatchInvariantOps(model): model(...)`: the forward pass batch-invariant (see the module docstring); the
    model's attention and experts implementations are switched for the block and restored after it."""

    def __init__(self, model):
        self.config = text_config(model.config)  # a vision tower keeps its own (bidirectional) attention
        self.mode = _Functions()
        self.saved: tuple = ()

    def __enter__(self) -> BatchInvariantOps:
        self.saved = (self.config._attn_implementation, getattr(self.config, "_experts_implementation", None))
        self.config._attn_implementation = ATTENTION
        if self.saved[1] is not None:
            self.config._experts_implementation = "eager"  # the per-expert F.linear loop, which `linear` replaces
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        self.config._attn_implementation = self.saved[0]
        if self.saved[1] is not None:
            self.config._experts_implementation = self.saved[1]
