"""The hf engine's side of the tensor and distributed weight syncs, in SGLang 0.5.23's dialect
(docs/engines.md#weight-sync).

    /begin_weight_update              open the update session (tensor and distributed updates need one)
    /end_weight_update                close it
    /init_weights_update_group        join the trainer's broadcast group (`slime.wire.weight_group`)
    /update_weights_from_distributed  receive the listed tensors from rank 0 in order, then load them
    /destroy_weights_update_group     leave the group
    /update_weights_from_tensor       open TP rank 0's serialised flattened bucket (`slime.wire.bucket_codec`)
                                      and copy it in, the copy finished before the reply; with `keep_mapping`
                                      (not SGLang's) the buffer stays mapped for the trainer's next buckets
                                      (`slime.wire.kept_mappings`)
    /weights_checker                  snapshot | reset_tensors | compare | checksum (`weight_checker.py`)
    /weight_digests                   every tensor's `slime.wire.weight_digest` digest (verified syncs; not SGLang's)

The session rules are SGLang's scheduler's (`sglang/srt/managers/scheduler_components/weight_updater.py:
SchedulerWeightUpdaterManager`): an update outside a session answers `success: false` with SGLang's message
and receives nothing; begin with a session open, or end without one, fails the same way. Replies are
`{success, message}`, HTTP 400 when not successful.

Receiving (joining, the broadcasts) runs in worker threads; only the copy into the model runs on the model
thread (`Scheduler.run_exclusive`), between batches. `open_items`, `join` and `receive` are the parts a
server with SGLang's own functions (the CPU tests' fake) replaces.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Sequence
from typing import Any, Optional

import torch
from aiohttp import web

from slime.engine.hf.weight_checker import WeightChecker, checker_reply, digests_reply
from slime.engine.hf.weights import StateLayout, WeightLoadError, load_weights_strict
from slime.wire import bucket_codec
from slime.wire.kept_mappings import KeptMappings
from slime.wire.tensors import parse_dtype
from slime.wire.weight_delta import DELTA_GAPS, DELTA_VALUES, apply_gap_delta, bits
from slime.wire.weight_group import CustomWeightGroup

logger = logging.getLogger("slime.engine.hf.weight_receiver")

GROUP_TIMEOUT_S = 600.0  # seconds a join or a broadcast may wait for the other ranks
NamedTensors = list[tuple[str, torch.Tensor]]


def _require(body: dict, *keys: str) -> list[Any]:
    missing = [k for k in keys if body.get(k) is None]
    if missing:
        raise WeightLoadError(f"missing fields {missing}")
    return [body[k] for k in keys]


async def _body(request: web.Request) -> dict:
    try:
        body = await request.json() if request.body_exists else {}
    except json.JSONDecodeError as exc:
        raise WeightLoadError(f"request body is not valid JSON: {exc}") from exc
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise WeightLoadError("request body must be a JSON object")
    return body


def _outside_session(route: str) -> WeightLoadError:
    return WeightLoadError(f"{route} must run between begin_weight_update() and end_weight_update()")


def apply_delta_to(layout: StateLayout, name: str, gaps: torch.Tensor, values: torch.Tensor) -> None:
    """Write one tensor's delta (`gaps` and `values` as bytes) into the model; WeightLoadError for a name it lacks or
    values that are not one element of its dtype per step."""
    if name not in layout.slots or name in layout.aliases:
        raise WeightLoadError(f"checkpoint does not match the model: a delta for unexpected tensor {name}")
    target = layout.tensor(name)
    gaps, values = gaps.clone(), values.clone()  # own storage: a view of a bucket's buffer may sit at any byte offset
    steps = gaps.view(torch.int16)
    if values.numel() != steps.numel() * target.element_size():
        raise WeightLoadError(
            f"a delta for {name} carries {values.numel()} bytes of values for {steps.numel()} positions; the engine "
            f"holds {target.dtype} ({target.element_size()} bytes an element)"
        )
    apply_gap_delta(target, steps, values.view(bits(target).dtype))


class WeightReceiver:
    """Weight-update state of one engine: its session, process groups and checker, and the model it loads into.

    `scheduler` is the engine's `Scheduler` (`run_exclusive`, `weight_version`).
    """

    def __init__(self, model: torch.nn.Module, scheduler, *, device: str, lora=None):
        self.model = model
        self.scheduler = scheduler
        self.device = device
        self.groups: dict[str, Any] = {}
        self.session_open = False
        self.layout = StateLayout(model)  # every bucket of every sync loads through it
        self.checker = WeightChecker(model, lora, renamed=self.layout.renamed)
        self.kept = KeptMappings()  # the trainer's reused staging buffers, opened once (model thread only)
        self._lock = threading.Lock()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/begin_weight_update", self.handle_begin),
            web.post("/end_weight_update", self.handle_end),
            web.post("/init_weights_update_group", self.handle_init_group),
            web.post("/update_weights_from_distributed", self.handle_update_from_distributed),
            web.post("/destroy_weights_update_group", self.handle_destroy_group),
            web.post("/update_weights_from_tensor", self.handle_update_from_tensor),
            web.get("/weights_checker", self.handle_check),
            web.post("/weights_checker", self.handle_check),
            web.post("/weight_digests", self.handle_digests),
        ]

    # ---- HTTP handlers ----------------------------------------------------------------------
    async def _reply(self, what: str, work: Awaitable[str]) -> web.Response:
        try:
            message = await work
        except (WeightLoadError, ValueError) as exc:
            logger.warning("%s failed: %s", what, exc)
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        logger.info("%s: %s (weight_version=%s)", what, message, self.scheduler.weight_version)
        return web.json_response({"success": True, "message": message})

    async def handle_begin(self, request: web.Request) -> web.Response:
        async def work() -> str:
            await _body(request)
            if self.session_open:
                raise WeightLoadError("a weight-update session is already open; call end_weight_update() first")
            self.session_open = True
            return "Success"

        return await self._reply("begin_weight_update", work())

    async def handle_end(self, request: web.Request) -> web.Response:
        async def work() -> str:
            await _body(request)
            if not self.session_open:
                raise WeightLoadError("no weight-update session is open; call begin_weight_update() first")
            self.session_open = False
            return "Success"

        return await self._reply("end_weight_update", work())

    async def handle_init_group(self, request: web.Request) -> web.Response:
        async def work() -> str:
            return await asyncio.to_thread(self.init_group, await _body(request))

        return await self._reply("init_weights_update_group", work())

    async def handle_destroy_group(self, request: web.Request) -> web.Response:
        async def work() -> str:
            return await asyncio.to_thread(self.destroy_group, await _body(request))

        return await self._reply("destroy_weights_update_group", work())

    async def handle_update_from_distributed(self, request: web.Request) -> web.Response:
        async def work() -> str:
            body = await _body(request)
            if not self.session_open:
                raise _outside_session("update_weights_from_distributed")
            tensors = await asyncio.to_thread(self.receive_request, body)
            count = await self.scheduler.run_exclusive(self.load, tensors, body.get("weight_version"))
            return f"Succeeded to update {count} tensors from group {body.get('group_name')!r}."

        return await self._reply("update_weights_from_distributed", work())

    async def handle_update_from_tensor(self, request: web.Request) -> web.Response:
        def copy_in(body: dict) -> str:  # on the model thread; the producer frees the bucket after the reply
            (items,) = _require(body, "serialized_named_tensors")
            if body.get("load_format") != "flattened_bucket":
                raise WeightLoadError(f"load_format={body.get('load_format')!r} is not supported (flattened_bucket)")
            if not isinstance(items, list) or not items:
                raise WeightLoadError("serialized_named_tensors must list one serialised bucket per engine TP rank")
            opened = self.open_items(items, keep=True) if body.get("keep_mapping") else self.open_items(items)
            count = self.load(opened, body.get("weight_version"))
            self.finish_copies()
            return f"Succeeded to update {count} tensors from a flattened bucket."

        async def work() -> str:
            body = await _body(request)
            if not self.session_open:
                raise _outside_session("update_weights_from_tensor")
            return await self.scheduler.run_exclusive(copy_in, body)

        return await self._reply("update_weights_from_tensor", work())

    async def handle_check(self, request: web.Request) -> web.Response:
        try:
            body = await _body(request)
        except WeightLoadError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        reply, status = await self.scheduler.run_exclusive(checker_reply, self.checker, body)
        return web.json_response(reply, status=status)

    async def handle_digests(self, request: web.Request) -> web.Response:
        return web.json_response(await self.scheduler.run_exclusive(digests_reply, self.checker, self.layout))

    # ---- the parts another implementation may replace ----------------------------------------
    def open_items(self, items: Sequence[str], keep: bool = False) -> NamedTensors:
        """TP rank 0's bucket (a one-rank engine reads item 0, as SGLang's TP rank 0 does), as views; `keep`: its
        buffer stays mapped (`self.kept`) for the next buckets it carries."""
        try:
            flat, metadata = self.kept.decode(items[0]) if keep else bucket_codec.decode(items[0])
            return bucket_codec.reconstruct(flat, metadata)
        except WeightLoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad payload is the caller's error
            raise WeightLoadError(f"cannot open the serialised bucket: {exc}") from exc

    def finish_copies(self) -> None:
        """Wait for the copies out of a bucket's buffer (the trainer may write the next bucket into it once this
        engine replied)."""
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.current_stream(torch.device(self.device)).synchronize()

    def join(self, address: str, port: int, rank: int, world_size: int, name: str, backend: str):
        """This engine's rank of the trainer's group (blocks until every rank joined)."""
        return CustomWeightGroup.join(
            address,
            port,
            rank=rank,
            world_size=world_size,
            group_name=name,
            backend=backend,
            timeout_s=GROUP_TIMEOUT_S,
        )

    def receive(self, group, names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]) -> NamedTensors:
        """The broadcasts of one update request, in order, into fresh tensors (blocking)."""
        received = []
        for name, dtype, shape in zip(names, dtypes, shapes):
            buffer = torch.empty([int(s) for s in shape], dtype=dtype, device=group.device)
            group.broadcast(buffer)
            received.append((str(name), buffer))
        return received

    # ---- distributed -------------------------------------------------------------------------
    def init_group(self, body: dict) -> str:
        address, port, offset, world, name = _require(
            body, "master_address", "master_port", "rank_offset", "world_size", "group_name"
        )
        backend = body.get("backend") or ("nccl" if self.device.startswith("cuda") else "gloo")
        with self._lock:
            if name in self.groups:
                raise WeightLoadError(f"group {name!r} already exists; destroy it first")
        group = self.join(str(address), int(port), int(offset), int(world), str(name), str(backend))
        with self._lock:
            self.groups[str(name)] = group
        return f"joined weight-update group {name!r} as rank {offset} of {world} ({backend})"

    def destroy_group(self, body: dict) -> str:
        (name,) = _require(body, "group_name")
        with self._lock:
            group = self.groups.pop(str(name), None)
        if group is None:
            raise WeightLoadError("The group to be destroyed does not exist.")
        group.close()
        return "Succeeded to destroy custom process group."

    def receive_request(self, body: dict) -> NamedTensors:
        names, dtypes, shapes, name = _require(body, "names", "dtypes", "shapes", "group_name")
        group = self.groups.get(str(name))
        if group is None:
            raise WeightLoadError(f"Group {name} not in {sorted(self.groups)}; call /init_weights_update_group first")
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightLoadError(
                f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}"
            )
        parsed = [parse_dtype(d) for d in dtypes]  # fails before any broadcast is awaited
        return self.receive(group, list(names), parsed, [list(s) for s in shapes])

    # ---- loading (model thread) ---------------------------------------------------------------
    def load(self, tensors: NamedTensors, version: Optional[Any]) -> int:
        """Copy a bucket in; a delta push's pairs (`<name>@delta.gaps`, `@delta.values`: slime.sync.delta) write the
        changed bits into the named weight in place, which must hold the values' dtype."""
        tensors = dict(tensors)
        deltas = {
            name.removesuffix(DELTA_GAPS): (
                tensors.pop(name),
                tensors.pop(name.removesuffix(DELTA_GAPS) + DELTA_VALUES),
            )
            for name in [n for n in tensors if n.endswith(DELTA_GAPS)]
        }
        count = load_weights_strict(self.model, tensors, partial=True, layout=self.layout)
        for name, (gaps, values) in deltas.items():
            apply_delta_to(self.layout, name, gaps, values)
        count += len(deltas)
        if version is not None:
            self.scheduler.weight_version = str(version)
        return count

    def close(self) -> None:
        with self._lock:
            groups, self.groups = list(self.groups.values()), {}
        for group in groups:
            group.close()
