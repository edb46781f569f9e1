"""MoE routing replay data: which experts each token was routed to, on the wire and in a training stream.

A sample's routes are int32 `[len(tokens) - 1, num_layers, topk]`: row i holds, for every MoE layer, the top-k
expert ids of token i's forward (the last token is never fed forward, so it has no row). On the wire and in a
`Sample` they are SGLang's encoding: base64 of the array's native int32 bytes (SGLang 0.5.23
`tokenizer_manager.py` `_handle_batch_output`, `meta_info["routed_experts"]`, decoded by
`state_capturer/routed_experts.py:extract_routed_experts_from_meta_info`).

`algo.routing_replay` (`slime.config.routing_replay.RoutingReplay`) picks whose routes a trainer's forwards follow.
"""

from __future__ import annotations

import base64

import numpy as np


def encode_routes(routes: np.ndarray) -> str:
    """Base64 of int32 `routes` (any shape), as SGLang returns them."""
    return base64.b64encode(np.ascontiguousarray(routes, dtype=np.int32).tobytes()).decode("ascii")


def decode_routes(text: str, *, num_tokens: int, num_layers: int, topk: int, start_len: int = 0) -> np.ndarray:
    """int32 `[num_tokens - 1 - start_len, num_layers, topk]` from the base64 an engine returned for a sequence of
    `num_tokens` tokens whose routes start at `start_len`. ValueError when the size does not match."""
    flat = np.frombuffer(base64.b64decode(text), dtype=np.int32)
    rows = max(0, num_tokens - 1 - start_len)
    if flat.size != rows * num_layers * topk:
        raise ValueError(
            f"the engine returned {flat.size} routed-expert ids for {num_tokens} tokens (routes from {start_len}); "
            f"expected {rows} rows x {num_layers} MoE layers x top-{topk} = {rows * num_layers * topk}: the engine "
            "serves a model whose MoE layers or top-k differ from the trainer's"
        )
    return flat.reshape(rows, num_layers, topk).copy()


def stream_routes(routes: list[np.ndarray], num_experts: int) -> np.ndarray:
    """int32 `[sum(rows + 1), num_layers, topk]`: the samples' routes in packed-stream order, each followed by one
    row for its last token (never fed forward by the engine; its output is never scored). The filler row cycles
    through the experts, as slime's `cp_utils._pad_routed_experts`, so it never piles tokens onto one expert."""
    parts = []
    for r in routes:
        filler = np.arange(r.shape[1] * r.shape[2]).reshape(1, r.shape[1], r.shape[2]) % num_experts
        parts.append(np.concatenate([r, filler.astype(np.int32)]))
    return np.concatenate(parts)


def split_stream_routes(stream: np.ndarray, token_counts: list[int]) -> list[np.ndarray]:
    """The inverse of `stream_routes`: per sample int32 `[tokens - 1, num_layers, topk]` from a stream's
    `[sum(tokens), num_layers, topk]`."""
    out, start = [], 0
    for n in token_counts:
        out.append(np.asarray(stream[start : start + n - 1], dtype=np.int32))
        start += n
    if start != stream.shape[0]:
        raise ValueError(f"a stream of {stream.shape[0]} routed rows for samples of {sum(token_counts)} tokens")
    return out
