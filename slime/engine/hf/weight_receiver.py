"""The hf engine's side of the tensor and distributed weight syncs, and the weight checksums (REFERENCE.md §8).

    /init_weights_update_group        join the trainer's broadcast group (`slime.sync.wire.WeightGroup`)
    /update_weights_from_distributed  receive the listed tensors from rank 0 in order, then load them
    /destroy_weights_update_group     leave the group
    /update_weights_from_tensor       map a flattened bucket (shared memory / CUDA IPC) and copy it in
    /weights_checksum                 sha256 of every tensor's bytes (`debug.check_weight_update_equal`)

The blocking parts (joining, receiving) run in worker threads, and only the copy into the model runs on
the model thread (`Scheduler.run_exclusive`), between batches; generation is paused by the trainer
around every sync anyway. A distributed update always receives every broadcast before it checks
names, so a bad request never leaves the trainer blocked mid-broadcast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable
from typing import Any

import torch
from aiohttp import web

from slime.engine.hf.weights import WeightLoadError, load_weights_strict
from slime.sync import wire

logger = logging.getLogger("slime.engine.hf.weight_receiver")

GROUP_TIMEOUT_S = 600.0  # seconds a join or a broadcast may wait for the other ranks


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
    if not isinstance(body, dict):
        raise WeightLoadError("request body must be a JSON object")
    return body


class WeightReceiver:
    """Weight-update state of one engine: its process groups, and the model it loads into.

    `scheduler` is the engine's `Scheduler` (`run_exclusive`, `weight_version`).
    """

    def __init__(self, model: torch.nn.Module, scheduler, *, device: str):
        self.model = model
        self.scheduler = scheduler
        self.device = device
        self.groups: dict[str, wire.WeightGroup] = {}
        self._lock = threading.Lock()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/init_weights_update_group", self.handle_init_group),
            web.post("/update_weights_from_distributed", self.handle_update_from_distributed),
            web.post("/destroy_weights_update_group", self.handle_destroy_group),
            web.post("/update_weights_from_tensor", self.handle_update_from_tensor),
            web.get("/weights_checksum", self.handle_checksum),
        ]

    # ---- HTTP handlers: `{success, message}`, HTTP 400 with success false on failure ------------
    async def _reply(self, what: str, work: Awaitable[str]) -> web.Response:
        try:
            message = await work
        except (WeightLoadError, ValueError) as exc:
            logger.warning("%s failed: %s", what, exc)
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        logger.info("%s: %s (weight_version=%s)", what, message, self.scheduler.weight_version)
        return web.json_response({"success": True, "message": message})

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
            tensors = await asyncio.to_thread(self.receive, body)
            count = await self.scheduler.run_exclusive(self.load, tensors, body.get("weight_version"))
            return f"Succeeded to update {count} tensors from group {body.get('group_name')!r}."

        return await self._reply("update_weights_from_distributed", work())

    async def handle_update_from_tensor(self, request: web.Request) -> web.Response:
        def copy_in(body: dict) -> str:  # on the model thread; the producer frees the bucket after the reply
            tensors = self.open_bucket(body)
            return (
                f"Succeeded to update {self.load(tensors, body.get('weight_version'))} tensors from a flattened bucket."
            )

        async def work() -> str:
            return await self.scheduler.run_exclusive(copy_in, await _body(request))

        return await self._reply("update_weights_from_tensor", work())

    async def handle_checksum(self, request: web.Request) -> web.Response:
        result = await self.scheduler.run_exclusive(self.checksums)
        return web.json_response({"weight_version": self.scheduler.weight_version, **result})

    # ---- distributed -------------------------------------------------------------------------
    def init_group(self, body: dict) -> str:
        """Join a group (blocks until every rank joined); returns a message."""
        address, port, offset, world, name = _require(
            body, "master_address", "master_port", "rank_offset", "world_size", "group_name"
        )
        backend = body.get("backend") or ("nccl" if self.device.startswith("cuda") else "gloo")
        with self._lock:
            if name in self.groups:
                raise WeightLoadError(f"group {name!r} already exists; destroy it first")
        store = wire.create_store(str(address), int(port), int(world), is_master=False, timeout_s=GROUP_TIMEOUT_S)
        group = wire.WeightGroup(
            store,
            rank=int(offset),
            world_size=int(world),
            group_name=str(name),
            backend=str(backend),
            timeout_s=GROUP_TIMEOUT_S,
            address=wire.local_address_towards(str(address)),
        )
        with self._lock:
            self.groups[str(name)] = group
        return f"joined weight-update group {name!r} as rank {offset} of {world} ({backend})"

    def destroy_group(self, body: dict) -> str:
        (name,) = _require(body, "group_name")
        with self._lock:
            group = self.groups.pop(str(name), None)
        if group is None:
            raise WeightLoadError(f"no weight-update group {name!r}")
        group.close()
        return f"destroyed weight-update group {name!r}"

    def receive(self, body: dict) -> dict[str, torch.Tensor]:
        """Receive the broadcasts listed by `names`/`dtypes`/`shapes` into fresh tensors (blocking)."""
        names, dtypes, shapes, name = _require(body, "names", "dtypes", "shapes", "group_name")
        group = self.groups.get(str(name))
        if group is None:
            raise WeightLoadError(f"no weight-update group {name!r}; call /init_weights_update_group first")
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightLoadError(
                f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}"
            )
        parsed = [wire.parse_dtype(d) for d in dtypes]  # fails before any broadcast is awaited
        received = {}
        for tensor_name, dtype, shape in zip(names, parsed, shapes):
            buffer = torch.empty([int(s) for s in shape], dtype=dtype, device=group.device)
            group.broadcast(buffer)
            received[str(tensor_name)] = buffer
        return received

    # ---- tensor ------------------------------------------------------------------------------
    def open_bucket(self, body: dict) -> dict[str, torch.Tensor]:
        """Decode the serialised bucket, one per engine TP rank (SGLang's TP rank i opens item i). This
        one-process engine loads item 0 and requires every other item to hold the same bytes."""
        (items,) = _require(body, "serialized_named_tensors")
        if body.get("load_format", "flattened_bucket") != "flattened_bucket":
            raise WeightLoadError(f"load_format={body.get('load_format')!r} is not supported (flattened_bucket)")
        if not isinstance(items, list) or not items:
            raise WeightLoadError(
                f"expected a list of serialised buckets (one per engine TP rank), got {type(items).__name__}"
            )
        try:
            opened = [self._open_item(item) for item in items]
        except WeightLoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad payload is the caller's error
            raise WeightLoadError(f"cannot open the serialised bucket: {exc}") from exc
        (buffer, metadata), rest = opened[0], opened[1:]
        for rank, (other, other_metadata) in enumerate(rest, start=1):
            if other_metadata != metadata or not torch.equal(other.cpu(), buffer.cpu()):
                raise WeightLoadError(f"the bucket of TP rank {rank} differs from TP rank 0's")
        return wire.unflatten(buffer, metadata)

    @staticmethod
    def _open_item(item: str) -> tuple[torch.Tensor, list]:
        payload = wire.decode(item)
        return wire.open_handle(payload["handle"]), payload["metadata"]

    # ---- loading and checking (model thread) --------------------------------------------------
    def load(self, tensors: dict[str, torch.Tensor], version: Any) -> int:
        count = load_weights_strict(self.model, tensors, partial=True)
        if version is not None:
            self.scheduler.weight_version = str(version)
        return count

    def checksums(self) -> dict[str, Any]:
        """`{dtype, checksums: {name: sha256 of the bytes}}` over the model's own tensors (tied aliases once)."""
        state = self.model.state_dict()
        names = [n for n, _ in self.model.named_parameters()]
        params = {n for n, _ in self.model.named_parameters(remove_duplicate=False)}
        names += [n for n in state if n not in params]  # persistent buffers
        return {
            "dtype": wire.dtype_name(next(self.model.parameters()).dtype),
            "checksums": {n: wire.tensor_sha256(state[n]) for n in names},
        }

    def close(self) -> None:
        with self._lock:
            groups, self.groups = list(self.groups.values()), {}
        for group in groups:
            group.close()
