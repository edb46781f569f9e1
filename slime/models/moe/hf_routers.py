"""Capture and replay of MoE routing in a transformers model, through forward hooks on its routers.

A router here is a module that maps hidden states `[rows, hidden]` to `(router_logits [rows, E], routing_weights
[rows, k], expert_ids [rows, k])`, one per MoE layer, in layer order (transformers 5's `*TopKRouter` modules).
Rows are the forward's tokens flattened batch-major (`[B, S]` -> `b * S + s`), which is also the packed
stream's order in a `[1, T]` forward. The tap lives on its owner (an engine's generator, a trainer's rank).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _softmax_topk_weights(router: nn.Module, logits: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """The routing weights `router` gives `expert_ids` [rows, k]: softmax over all experts in fp32, gathered,
    renormalised over the k when `norm_topk_prob`, in the logits' dtype (transformers
    `models/qwen3_moe/modeling_qwen3_moe.py:Qwen3MoeTopKRouter.forward`, with the top-k choice replaced)."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    weights = probs.gather(-1, expert_ids)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


# router class name -> how its routing weights follow from its logits and a given top-k choice
REPLAYABLE_ROUTERS: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Qwen3MoeTopKRouter": _softmax_topk_weights,
}


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's routers in layer order; ValueError when it has MoE routers this module cannot replay."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    unknown = sorted({type(m).__name__ for m in routers} - set(REPLAYABLE_ROUTERS))
    if unknown:
        raise ValueError(f"MoE routing capture/replay supports routers {sorted(REPLAYABLE_ROUTERS)}; got {unknown}")
    return routers


class RouterTap:
    """Forward hooks on every router of `model`.

    `capture()` collects each router forward's expert ids; `take()` returns them as `[rows, layers, k]` (one
    model forward) and forgets them. `replay(routes)` makes every router forward use `routes[:, layer]` (int64
    `[rows, layers, k]`) until `replay(None)`; the routing weights follow from the router's own logits, so the
    gradient still reaches the router.
    """

    def __init__(self, model: nn.Module):
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE routers to capture or replay")
        self._capturing = False
        self._captured: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self._replay: torch.Tensor | None = None
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    @property
    def num_layers(self) -> int:
        return len(self.routers)

    @property
    def topk(self) -> int:
        return int(self.routers[0].top_k)

    def _hook(self, layer: int):
        weights_of = REPLAYABLE_ROUTERS[type(self.routers[layer]).__name__]

        def hook(module, args, output):
            logits, weights, expert_ids = output
            if self._replay is not None:
                forced = self._replay[:, layer].to(expert_ids.device)
                if forced.shape != expert_ids.shape:
                    raise RuntimeError(
                        f"routing replay: layer {layer} routes {tuple(expert_ids.shape)} tokens x top-k, "
                        f"the replayed routes are {tuple(forced.shape)}"
                    )
                expert_ids, weights = forced, weights_of(module, logits, forced)
            if self._capturing:
                self._captured[layer].append(expert_ids.detach())
            return logits, weights, expert_ids

        return hook

    @contextlib.contextmanager
    def capture(self):
        self._capturing = True
        try:
            yield self
        finally:
            self._capturing = False

    def take(self) -> torch.Tensor:
        """int64 `[rows, layers, k]` of the forwards captured since the last take (concatenated by rows)."""
        if any(len(c) != len(self._captured[0]) for c in self._captured) or not self._captured[0]:
            raise RuntimeError("routing capture: no forward, or a forward that skipped some MoE layers")
        routes = torch.stack([torch.cat(c) for c in self._captured], dim=1)
        self._captured = [[] for _ in self.routers]
        return routes

    def replay(self, routes: torch.Tensor | None) -> None:
        """Replay `routes` (int64 `[rows, layers, k]`) in every forward from now on; None: route freely again."""
        if routes is not None and (routes.shape[1] != self.num_layers or routes.shape[2] != self.topk):
            raise ValueError(
                f"routing replay: routes of {routes.shape[1]} layers x top-{routes.shape[2]} for a model of "
                f"{self.num_layers} MoE layers x top-{self.topk}"
            )
        self._replay = routes

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
