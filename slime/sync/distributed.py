"""Distributed weight sync (docs/engines.md#distributed-mode): the trainer's source rank broadcasts into every engine.

    group:      trainer = rank 0, engine e's TP ranks = rank_offset(e) .. + tp_size(e) - 1,
                world size 1 + sum of engine TP sizes; gloo on CPU, NCCL on CUDA (`slime.wire.weight_group`)
    per bucket: POST /update_weights_from_distributed {names, dtypes, shapes} to every engine (threads),
                broadcast each tensor from rank 0 in that order, then await every reply

The group is built when the sync object is made (the runtime makes a new one whenever the engines
change: `TrainBackend.connect_weight_sync` closes the old one first), rebuilt by the next push after an
engine failed mid-sync (a restarted engine at the same URL no longer knows the group), and destroyed
by `close`.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from urllib.parse import urlparse

import torch

from slime.engine.client import EngineClient
from slime.engine.http_client import EngineHTTPError
from slime.net import local_address_towards
from slime.sync.base import SyncContext, WeightSync
from slime.wire.tensors import Bucket, dtype_name, parse_dtype

logger = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 600.0  # seconds a join or a broadcast may wait for the slowest rank
_GENERATION = itertools.count()


def _await_all(futures: dict[Future, EngineClient], what: str) -> None:
    """Wait for every engine's reply; raise the first failure (its message names the engine URL)."""
    errors = []
    for future, engine in futures.items():
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - collected, then raised together
            errors.append(exc if engine.url in str(exc) else RuntimeError(f"{engine.url}: {what} failed: {exc}"))
    if errors:
        if len(errors) > 1:
            logger.error("%s failed on %d engines: %s", what, len(errors), "; ".join(map(str, errors)))
        raise errors[0]


class DistributedWeightSync(WeightSync):
    """`rollout.weight_sync.mode=distributed`: one broadcast group over the source rank and all engines."""

    mode = "distributed"

    def __init__(self, engines: Sequence[EngineClient], context: SyncContext):
        super().__init__(engines, context)
        self.group = None  # the trainer's end: `.device`, `.broadcast(tensor)`, `.close()`
        self.group_name: str | None = None
        self._stale: list[tuple[str, object | None]] = []  # dropped groups the engines may still hold
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.engines)), thread_name_prefix="weight-sync")
        self._local = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-trainer")
        self.connect()

    @property
    def backend(self) -> str:
        return "nccl" if torch.cuda.is_available() and torch.cuda.is_initialized() else "gloo"

    def connect(self) -> None:
        """(Re)create the group: the trainer hosts the rendezvous and joins while every engine joins. The
        engines' client class gives the trainer's end (SGLang's `init_custom_process_group` rendezvous, or
        vLLM's own); each group has its own store on a fresh port and a name unique in this process."""
        self._destroy_group()
        host = urlparse(self.engines[0].url).hostname or "127.0.0.1"
        address = local_address_towards(host)
        tp_sizes = [int(e.server_info().get("tp_size", 1) or 1) for e in self.engines]
        world_size = 1 + sum(tp_sizes)
        name = f"slime-weights-{os.getpid()}-{next(_GENERATION)}"
        backend = self.backend
        end = type(self.engines[0]).trainer_weight_group(
            address=address, world_size=world_size, group_name=name, backend=backend, timeout_s=GROUP_TIMEOUT_S
        )
        offsets = itertools.accumulate([1, *tp_sizes])
        futures = {
            self._pool.submit(
                engine.init_weights_update_group,
                master_address=address,
                master_port=end.port,
                rank_offset=offset,
                world_size=world_size,
                group_name=name,
                backend=backend,
                timeout=GROUP_TIMEOUT_S,
            ): engine
            for engine, offset in zip(self.engines, offsets)
        }
        self.group = self._alongside(end.join, futures, "POST /init_weights_update_group")
        self.group_name = name
        logger.info("weight-update group %s: %d ranks over %s (%s)", name, world_size, address, backend)

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        if self.group is None:  # dropped after an engine failed mid-sync (e.g. it restarted): rebuild it
            self.connect()
        total = 0
        for bucket in buckets:
            tensors = [t.detach().to(self.group.device).contiguous() for _, t in bucket]
            for tensor in tensors:
                parse_dtype(dtype_name(tensor.dtype))  # refused here, before any engine waits on it
            futures = {
                self._pool.submit(
                    engine.update_weights_from_distributed,
                    names=[n for n, _ in bucket],
                    dtypes=[dtype_name(t.dtype) for t in tensors],
                    shapes=[list(t.shape) for t in tensors],
                    group_name=self.group_name,
                    weight_version=weight_version,
                    timeout=GROUP_TIMEOUT_S,
                ): engine
                for engine in self.engines
            }
            group = self.group

            def broadcast_all(tensors=tensors, group=group) -> None:  # runs (and ends) within this iteration
                for tensor in tensors:
                    group.broadcast(tensor)

            self._alongside(broadcast_all, futures, "POST /update_weights_from_distributed")
            total += sum(t.numel() * t.element_size() for t in tensors)
        return total

    def _alongside(self, local, futures: dict[Future, EngineClient], what: str):
        """Run the trainer's side of a collective while the engines' calls run; returns its result.

        On any failure the group is dropped (the next push rebuilds it), and an engine that fails before
        taking part is reported at once, not after the trainer waited out the group timeout.
        """
        mine = self._local.submit(local)
        wait([mine, *futures], return_when=FIRST_EXCEPTION)
        engine_failed = any(f.done() and f.exception() is not None for f in futures)
        if engine_failed and not mine.done():
            self._drop(abandon=True)
            self._local.shutdown(wait=False)  # its thread stays blocked until the group timeout, then ends
            self._local = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-trainer")
            _await_all({f: e for f, e in futures.items() if f.done()}, what)
        try:
            result = mine.result()
            _await_all(futures, what)
        except Exception:
            self._drop()
            _await_all(futures, what)  # an engine's own error says more
            raise
        return result

    def _drop(self, abandon: bool = False) -> None:
        """Stop using the group; the next connect() still asks the engines to destroy it. `abandon`: a
        trainer thread is still blocked in it, so its process group is left to time out, not closed."""
        if self.group is not None:
            self._stale.append((self.group_name, None if abandon else self.group))
        self.group, self.group_name = None, None

    def _destroy_group(self) -> None:
        self._drop()
        stale, self._stale = self._stale, []
        for name, group in stale:
            for engine in self.engines:
                try:
                    engine.destroy_weights_update_group(name)
                except Exception as exc:  # noqa: BLE001 - a restarted or stopped engine no longer knows the group
                    gone = isinstance(exc, EngineHTTPError) and (exc.status is None or "does not exist" in exc.body)
                    logger.log(
                        logging.INFO if gone else logging.WARNING,
                        "%s: destroying weight-update group %s failed: %s",
                        engine.url,
                        name,
                        exc,
                    )
            if group is not None:
                group.close()

    def close(self) -> None:
        self._destroy_group()
        self._pool.shutdown(wait=False)
        self._local.shutdown(wait=False)
