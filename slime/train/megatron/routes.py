"""MoE routing replay on megatron-core's own mechanism (`moe/router_replay.py:RouterReplay`, one per router when
`moe_enable_routing_replay` is set): each router of a model chunk records its top-k choice or replays given
expert ids, micro-batch by micro-batch.

A router sees its micro-batch's local stream (`slime.train.megatron.batch`): the packed samples with their
padding, this CP rank's zigzag chunks, and with sequence parallelism this TP rank's slice of them, one row per
token. `layout_routes` puts per-sample routes in that order.
"""

from __future__ import annotations

import numpy as np
import torch
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplayAction

from slime.train.megatron.batch import MicroBatch, local_positions


def moe_routers(chunk: torch.nn.Module) -> list[TopKRouter]:
    """The chunk's routers that can replay (built with `moe_enable_routing_replay`)."""
    return [m for m in chunk.modules() if isinstance(m, TopKRouter) and m.router_replay is not None]


def layout_routes(
    sample_routes: list[np.ndarray], packed: MicroBatch, *, cp: int, sp_size: int, sp_rank: int, num_experts: int
) -> np.ndarray:
    """int32 `[local rows, layers, k]` of a micro-batch whose samples have routes `sample_routes[j]` (`[tokens_j -
    1, layers, k]`), in the order its routers see the tokens. Rows no engine routed (each sample's last token,
    padding) cycle through the experts, as slime's `cp_utils._pad_routed_experts`."""
    cu = packed.host_cu_seqlens
    _, layers, k = sample_routes[0].shape
    full = (np.arange(cu[-1] * layers * k, dtype=np.int64) % num_experts).astype(np.int32).reshape(-1, layers, k)
    for start, routes in zip(cu, sample_routes):
        full[start : start + routes.shape[0]] = routes
    local = full[local_positions(list(cu), cp, packed.cp_rank).numpy()]
    if sp_size > 1:
        local = np.split(local, sp_size)[sp_rank]
    return local


def replay(routers: list[TopKRouter], by_layer: dict[int, torch.Tensor] | None) -> None:
    """Make every router replay `by_layer[layer_number]` (int64 `[rows, k]`); None: route freely."""
    for router in routers:
        rr = router.router_replay
        rr.clear_indices()
        if by_layer is None:
            rr.clear_router_replay_action()
            continue
        rr.set_target_indices(by_layer[router.layer_number])
        rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def by_layer(routes: np.ndarray, device: torch.device) -> dict[int, torch.Tensor]:
    """`layout_routes`' array as `replay` takes it: layer number (1-based) -> int64 `[rows, k]` on `device`."""
    tensor = torch.from_numpy(routes).long().to(device)
    return {layer + 1: tensor[:, layer] for layer in range(tensor.shape[1])}


def record(routers: list[TopKRouter]) -> None:
    """Make every router record its own top-k choice in its next forward."""
    for router in routers:
        router.router_replay.clear_indices()
        router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)


def recorded(routers: list[TopKRouter]) -> dict[int, torch.Tensor]:
    """The routers' recorded choices: layer number -> int64 `[rows, k]`."""
    return {r.layer_number: r.router_replay.get_recorded_indices() for r in routers}
