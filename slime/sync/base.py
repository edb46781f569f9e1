"""`WeightSync`: how a trainer's new weights reach the engines (docs/engines.md#weight-sync).

One class per `rollout.weight_sync.mode`, registered in `slime.registry.WEIGHT_SYNC`. A sync object
lives on the trainer's source rank; the train backend feeds it the iterator of HF-named tensor buckets
it exports (`TrainBackend.export_weights`), and it talks to the engines through `EngineClient`s
(plain HTTP) that it builds itself (`connect_weight_sync`: the trainer passes engine URLs, never clients, so
trainers import no engine). No Ray inside: the runtime hands the trainer engine URLs and the config.
The tensors' formats on the wire are `slime.wire`'s, which the engines import too.

The protocol every mode follows (`push`): pause generation (`SyncContext.pause_mode`) and, unless the pause holds
the running requests in place, flush the cache on every updatable engine, open each engine's update session
(tensor and distributed modes: SGLang's `/begin_weight_update`), transfer the buckets (the mode's own
`_transfer`), close the sessions, then continue generation, so that no request ever runs on half-updated weights;
engines stamp the new `weight_version` on every later response, and the rollout records it on each Sample. A failed
push still closes the sessions it opened and continues generation, then raises.

With `verify` every push is checked once the sessions closed: the digests the trainer took of each bucket as it
passed (beside the transfer) against what each engine then holds (slime.sync.verify, WeightMismatchError naming the
engine, the buckets and the tensors). With `defer_verify` that check runs on a thread of its own once the push has
ended, beside the generation that follows: `verified()` awaits it (raising its mismatch), as does the next push
before it starts; the caller awaits it before it trains on what the engines generate. With `delta_full_every`
pushes after a full one carry only the changed bits (slime.sync.delta).

`check_weight_update_equal` (slime's `--check-weight-update-equal`) drives SGLang's `/weights_checker`: once
the engines are up, each snapshots the weights it loaded from the checkpoint and overwrites them with random
values (the rollout manager, before a colocated engine first releases its memory); after the run's first push
(weight version 0: a fresh run, whose trainer starts from the same checkpoint) every engine compares with its
snapshot, so a tensor the push did not deliver, or delivered changed, fails the run naming it; after every
push, engines of one parallel layout must report the same checksum (`check_pushed`; an adapter sync also compares
the trained base weights it moved: slime.sync.adapter).
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from slime.config.async_mode import PauseMode
from slime.config.hooks import load_callable
from slime.engine.base import engine_client
from slime.engine.client import EngineClient
from slime.engine.http_client import EngineHTTPError
from slime.registry import WEIGHT_SYNC
from slime.sync.delta import DeltaPushes
from slime.sync.verify import Verifier, WeightMismatchError, corrupted

__all__ = ["SyncContext", "SyncedAdapter", "WeightMismatchError", "WeightSync", "connect_weight_sync"]

if TYPE_CHECKING:  # annotations only
    from slime.wire.tensors import Bucket

logger = logging.getLogger(__name__)

# a check beside generation first lets the push's caller go on: its own Python work would otherwise hold the GIL
# the caller needs to return the push (about 0.8 ms of a 9 ms push on 2 vCPUs)
CHECK_YIELD_S = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncedAdapter:
    """The policy's LoRA adapter as the engines load it: its name (`EngineLaunch.lora.adapter_name`) and peft's
    adapter_config.json as a dict."""

    name: str
    config: dict


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncContext:
    """What every mode may use besides the engines."""

    source_checkpoint: str  # HF dir whose config and tokenizer files describe the model
    engine: str = "sglang"  # rollout.engine: which control client talks to the engines
    work_dir: str  # scratch space of this run (disk mode writes weight_v<N> dirs under it)
    bucket_bytes: int  # bucket size the exporter fills, in bytes
    keep: bool = False  # disk: keep each pushed directory
    check_weight_update_equal: bool = False  # debug: engines' /weights_checker around the pushes (module docstring)
    verify: bool = False  # rollout.weight_sync.verify: every push compared with what each engine holds after it
    defer_verify: bool = False  # that comparison runs after the push, beside generation, until `verified()`
    delta_full_every: int = 0  # rollout.weight_sync.delta: a full push every this many (0: every push is full)
    corrupt_version: int | None = None  # debug.corrupt_push_version: this version's push flips a byte once verified
    # rollout.weight_sync.pause_mode, resolved: abort ends running requests; in_place holds them across the push, so
    # no cache is flushed (SGLang refuses while requests run)
    pause_mode: PauseMode = PauseMode.ABORT
    # tensor mode: per engine (in push order), the training rank colocated with each engine TP rank (-1: none)
    tp_trainer_ranks: tuple[tuple[int, ...], ...] = ()
    adapter: SyncedAdapter | None = None  # the policy's LoRA adapter moves alone (None: full weights)


class WeightSync(abc.ABC):
    """Pushes weights into `engines` (every one of them receives each push)."""

    mode = "base"
    bracketed = True  # the buckets go between the engines' begin_weight_update and finish_weight_update
    pushes_base = True  # the push carries every weight (check_weight_update_equal compares them after the first)

    def __init__(self, engines: Sequence[EngineClient], context: SyncContext):
        self.engines = list(engines)
        self.context = context
        self.phases: dict[str, float] = {}  # the mode's own `perf/*` seconds of its last transfer (`_transfer`)
        adapter = context.adapter.name if context.adapter is not None else None
        self.verifier = (
            Verifier(source_checkpoint=context.source_checkpoint, adapter=adapter) if context.verify else None
        )
        self.deltas = DeltaPushes(context.delta_full_every) if context.delta_full_every else None
        self._check: concurrent.futures.Future | None = None  # defer_verify: the last push's check, running

    @classmethod
    def follower(cls, context: SyncContext, rank: int):
        """What a non-source training rank holds for this mode: an object whose `follow(buckets)` joins each
        push's collectives, or None when the source rank pushes alone."""
        return None

    def push(self, buckets: Iterable[Bucket], *, weight_version: int) -> dict[str, float]:
        """pause -> flush -> begin -> transfer -> end -> continue on every engine; returns `perf/*` timings (s)."""
        self.verified()  # the last push's check ends first: a mismatch there is this sync's to raise
        start = time.perf_counter()
        paused: list[EngineClient] = []
        opened: list[EngineClient] = []
        check_first = self.context.check_weight_update_equal and weight_version == 0 and self.pushes_base
        try:
            for engine in self.engines:
                engine.pause_generation(self.context.pause_mode.value)
                paused.append(engine)
            for engine in () if self.keeps_requests else self.engines:
                engine.flush_cache()
            if self.bracketed:
                for engine in self.engines:
                    engine.begin_weight_update()
                    opened.append(engine)
            ledger = self.verifier.ledger(self.engines) if self.verifier is not None else None
            stream = ledger.watch(buckets) if ledger else buckets
            if self.context.corrupt_version == weight_version:
                stream = corrupted(stream)
            if self.deltas is not None:
                stream = self.deltas.encode(stream, self.verifier.served_dtype() if self.verifier else None)
            transferred = self._transfer(stream, weight_version=str(weight_version))
            for engine in list(opened):
                engine.finish_weight_update(str(weight_version))
                opened.remove(engine)
            if ledger is not None and not self.context.defer_verify:
                self.phases["perf/update_weights_verify_time"] = self._verify(ledger, str(weight_version))
            if check_first:
                self._each_check("compare")
            if self.context.check_weight_update_equal:
                self.check_pushed()
        except BaseException:
            if self.deltas is not None:
                self.deltas.failed()
            self._end_sessions(opened)
            self._continue(paused, raise_errors=False)  # the sync's own error is the one to report
            raise
        self._continue(paused, raise_errors=True)
        if ledger is not None and self.context.defer_verify:
            self._check = self._verify_beside(ledger, str(weight_version))
        return {
            "perf/update_weights_time": time.perf_counter() - start,
            "perf/update_weights_bytes": float(transferred),
            **self.phases,
            **(self.deltas.metrics() if self.deltas is not None else {}),
        }

    @property
    def keeps_requests(self) -> bool:
        """Whether the push holds the running requests in place (no cache may be flushed under them)."""
        return self.context.pause_mode is PauseMode.IN_PLACE

    def _end_sessions(self, engines: Sequence[EngineClient]) -> None:
        """Close the update sessions a failed push left open (the next push could not open one)."""
        for engine in engines:
            try:
                engine.finish_weight_update(None)
            except Exception as exc:  # noqa: BLE001 - an engine that died mid-push has no session to close
                logger.warning("%s: end_weight_update after a failed push failed: %s", engine.url, exc)

    def _continue(self, engines: Sequence[EngineClient], *, raise_errors: bool) -> None:
        """Continue generation on every engine, even when one of them fails."""
        errors = []
        for engine in engines:
            try:
                engine.continue_generation()
            except Exception as exc:  # noqa: BLE001 - the others still continue
                logger.error("%s: continue_generation after a weight sync failed: %s", engine.url, exc)
                errors.append(exc)
        if errors and raise_errors:
            raise errors[0]

    @abc.abstractmethod
    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        """Move every bucket into every engine and have them load it; returns the bytes moved."""

    def verified(self) -> dict[str, float]:
        """`defer_verify`: await the last push's check (WeightMismatchError when an engine holds other weights);
        its `perf/update_weights_verify_time` (s). {} when no check is running."""
        check, self._check = self._check, None
        if check is None:
            return {}
        try:
            return {"perf/update_weights_verify_time": check.result()}
        except BaseException:
            if self.deltas is not None:  # the engines' base for the next delta is not known
                self.deltas.failed()
            raise

    def _verify_beside(self, ledger, weight_version: str) -> concurrent.futures.Future:
        """`_verify` on a thread of its own; the future holds its seconds or its error."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def check() -> None:
            time.sleep(CHECK_YIELD_S)
            try:
                future.set_result(self._verify(ledger, weight_version))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the check
                future.set_exception(exc)

        threading.Thread(target=check, name=f"verify-push-{weight_version}", daemon=True).start()
        return future

    def _verify(self, ledger, weight_version: str) -> float:
        """`rollout.weight_sync.verify`: every engine holds what the push carried (slime.sync.verify); engines that
        cannot report their tensors whole are compared with each other. Its seconds, the trainer's hashing
        (beside the transfer) included, are `perf/update_weights_verify_time`; returns them."""
        start = time.perf_counter()
        unreported = self.verifier.check(self.engines, ledger, weight_version)
        if len(unreported) > 1:
            try:
                self.check_engines_agree(unreported)
            except NotImplementedError as exc:  # an engine kind without SGLang's checker
                logger.info("the engines' weights are not compared with each other: %s", exc)
        return ledger.seconds + time.perf_counter() - start

    def _each_check(self, action: str) -> None:
        """`/weights_checker {action}` on every engine; WeightMismatchError with the engine's message on failure."""
        for engine in self.engines:
            try:
                engine.check_weights(action)
            except EngineHTTPError as exc:
                raise WeightMismatchError(
                    f"{engine.url}: weights_checker {action} failed (debug.check_weight_update_equal): {exc.body}"
                ) from None

    def check_pushed(self) -> None:
        """`check_weight_update_equal` after every push: the engines agree (`check_engines_agree`)."""
        self.check_engines_agree()

    def check_engines_agree(self, engines: Sequence[EngineClient] | None = None) -> dict[str, dict]:
        """Every engine's checksum (`per_engine_checksum`) equals that of each other engine of its parallel
        layout (of `engines`, default all); WeightMismatchError naming the engines that differ. Returns {engine URL:
        its checksum reply}."""
        by_layout: dict[str, dict[str, list[str]]] = {}
        replies = {}
        for engine in self.engines if engines is None else engines:
            reply = replies[engine.url] = engine.check_weights("checksum")
            ranks = reply.get("ranks") or []
            layout = json.dumps([r.get("parallelism_info") for r in ranks], sort_keys=True)
            by_layout.setdefault(layout, {}).setdefault(str(reply.get("per_engine_checksum")), []).append(engine.url)
        for groups in by_layout.values():
            if len(groups) > 1:
                raise WeightMismatchError(
                    "engines hold different weights after the sync: "
                    + "; ".join(f"{urls} checksum {checksum[:16]}" for checksum, urls in groups.items()),
                    [url for urls in groups.values() for url in urls],
                )
        logger.info("weights of %d engines agree after the sync (weights_checker checksum)", len(self.engines))
        return replies

    def close(self) -> None:
        """Release what the mode holds (directories, process groups)."""


def connect_weight_sync(mode: str, engine_urls: Sequence[str], context: SyncContext) -> WeightSync:
    """The `rollout.weight_sync.mode` object pushing into the servers at `engine_urls`, with a control client
    of engine kind `context.engine` for each."""
    engines = [engine_client(context.engine, url) for url in engine_urls]
    if context.adapter is not None:  # validation refused the modes without one (slime.sync.check.check_adapter_sync)
        return load_callable(WEIGHT_SYNC.facts(mode).adapter_sync, key="rollout.weight_sync.mode")(engines, context)
    return WEIGHT_SYNC.load(mode)(engines, context)


def connect_follower(mode: str, context: SyncContext, rank: int):
    """What non-source training rank `rank` holds for `mode` (`WeightSync.follower`): None for most modes, and for
    an adapter's sync (the source pushes it alone)."""
    if context.adapter is not None:
        return None
    return WEIGHT_SYNC.load(mode).follower(context, rank)
