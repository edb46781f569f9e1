"""The rendezvous of the fake servers' nodes (tests/fakes): an engine spanning nodes runs a server per node, and they
meet at the first node's address before node rank 0 serves, as SGLang's schedulers (`--dist-init-addr`) and vLLM's
multi-node workers (`--master-addr` / `--master-port`) meet in torch.distributed's TCPStore there."""

from __future__ import annotations

import datetime
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)


def join_nodes(address: str, *, num_nodes: int, node_rank: int):
    """The store at `address` (host:port), hosted by node rank 0; returns once all `num_nodes` have joined (node rank
    0 is not ready before then)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return dist.TCPStore(
        host,
        int(port),
        world_size=num_nodes,
        is_master=node_rank == 0,
        wait_for_workers=True,
        timeout=datetime.timedelta(seconds=300),
    )


def follow_until_node_zero_is_gone(store, node_rank: int) -> None:
    """A node rank >= 1 ends when node rank 0 does (its store goes with it), as the real servers' workers end with
    the group; the process exits without interpreter finalisation."""
    stop = threading.Event()
    while not stop.wait(0.5):
        try:
            store.check(["node rank 0"])  # any call: it fails once node rank 0, which hosts the store, is gone
        except Exception:  # noqa: BLE001 - node rank 0 is gone
            logger.info("node rank 0 is gone: node rank %d stops", node_rank)
            break
    sys.stderr.flush()
    os._exit(0)
