"""The weight-transfer routes of the fake vLLM server (tests/fakes/fake_vllm.py): vLLM 0.33.0's RL router.

    POST /init_weight_transfer_engine {"init_info"}   nccl: every worker joins the trainer's group as rank
                                                      rank_offset + i (gloo here); ipc: records `packed`
    POST /start_weight_update, /update_weights {"update_info"}, /finish_weight_update {"weight_version"}
    POST /shutdown_weight_transfer_engine, /update_weight_version {"new_version"}

Mixed into the fake server class, which provides `cli` (the parsed command line), `scheduler`, `receiver`,
`sleeping` and `_world()`. Failures answer vLLM's ErrorResponse with the status vLLM gives them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pickle

import torch
from aiohttp import web

from slime.sync import wire

GROUP = "vllm-weight-transfer"  # the store prefix of the trainer's group (VLLMClient.weight_group_name)


def error(message: str, status: int, kind: str = "BadRequestError") -> web.Response:
    """vLLM's ErrorResponse body."""
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
    )


class WeightTransferRoutes:
    """State and handlers of the server's weight-transfer engine (see the module docstring)."""

    def init_transfer_state(self) -> None:
        self.backend = (self.cli.weight_transfer_config or {}).get("backend", "nccl")
        self.packed = False
        self.updating = False  # between /start_weight_update and /finish_weight_update
        self.groups: list = []  # the weight-transfer group, one member per worker (nccl backend)

    def transfer_routes(self) -> dict:
        return {
            "/init_weight_transfer_engine": self.init_transfer,
            "/shutdown_weight_transfer_engine": self.shutdown_transfer,
            "/start_weight_update": self.start_update,
            "/update_weights": self.update_weights,
            "/finish_weight_update": self.finish_update,
            "/update_weight_version": self.update_weight_version,
        }

    async def init_transfer(self, request):
        init = (await request.json()).get("init_info") or {}
        if self.backend == "ipc":
            self.packed = bool(init.get("packed", False))
            return web.json_response({"message": "Weight transfer initialized"})
        missing = [k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in init]
        if missing:
            return error(f"init_info misses {missing} (backend {self.backend})", 500, "InternalServerError")
        self._drop_groups()
        # every worker of the server joins as its own rank (rank_offset + i) under the group's one store
        # prefix, as vLLM's workers do; the trainer (rank 0) uses the same prefix (VLLMClient.weight_group_name)
        address, port, world = str(init["master_address"]), int(init["master_port"]), int(init["world_size"])

        def join(rank: int) -> wire.WeightGroup:
            store = wire.create_store(address, port, world, is_master=False, timeout_s=600)
            return wire.WeightGroup(
                store,
                rank=rank,
                world_size=world,
                group_name=GROUP,
                backend="gloo",
                timeout_s=600,
                address=address,
            )

        offset = int(init["rank_offset"])
        self.groups = await asyncio.gather(*(asyncio.to_thread(join, offset + i) for i in range(self._world())))
        return web.json_response({"message": "Weight transfer initialized"})

    def _drop_groups(self) -> None:
        groups, self.groups = self.groups, []
        for group in groups:
            group.close()

    def _receive(self, group, names, dtypes, shapes) -> dict:
        out = {}
        for name, dtype, shape in zip(names, dtypes, shapes):
            out[name] = torch.empty([int(x) for x in shape], dtype=wire.parse_dtype(dtype))
            group.broadcast(out[name])
        return out

    async def shutdown_transfer(self, request):
        self._drop_groups()
        return web.json_response({"message": "Weight transfer shut down"})

    async def start_update(self, request):
        self.updating = True
        return web.json_response({"message": "Weight update started"})

    async def update_weights(self, request):
        info = (await request.json()).get("update_info") or {}
        if not self.updating:
            return error("update_weights before /start_weight_update", 500, "InternalServerError")
        if "weights" in self.sleeping:
            return error("weights are asleep: wake_up(tags=['weights']) before updating", 500, "Internal")
        names, dtypes, shapes = info.get("names", []), info.get("dtype_names", []), info.get("shapes", [])
        if not len(names) == len(dtypes) == len(shapes):
            return error("`dtype_names` should be of the same size as `names`", 500, "InternalServerError")
        if self.backend == "ipc":
            tensors = self._open_ipc(info, names, dtypes, shapes)
            if isinstance(tensors, web.Response):
                return tensors
        else:
            if not self.groups:
                return error("weight transfer engine not initialized", 500, "InternalServerError")
            received = await asyncio.gather(
                *(asyncio.to_thread(self._receive, g, names, dtypes, shapes) for g in self.groups)
            )
            tensors = received[0]  # every worker got the same broadcasts
        await self.scheduler.run_exclusive(self.receiver.load, tensors, None)
        return web.json_response({"message": "Weights updated"})

    def _open_ipc(self, info: dict, names, dtypes, shapes):
        if info.get("ipc_handles_pickled") is not None and os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
            return error(
                "Refusing to deserialize `ipc_handles_pickled` without VLLM_ALLOW_INSECURE_SERIALIZATION=1", 500
            )
        if not self.packed or info.get("tensor_sizes") is None:
            return error("`tensor_sizes` is required when packed=True", 500, "InternalServerError")
        handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
        if "cpu" not in handles:
            return error(f"IPC handle not found for GPU UUID cpu. Available UUIDs: {list(handles)}", 500)
        path, offset, nbytes = handles["cpu"]
        buffer = torch.from_file(path, shared=False, size=offset + nbytes, dtype=torch.uint8)[offset:]
        metadata, start = [], 0
        for name, dtype, shape, size in zip(names, dtypes, shapes, info["tensor_sizes"]):
            metadata.append({"name": name, "dtype": dtype, "shape": shape, "start": start, "end": start + size})
            start += size
        return {k: v.clone() for k, v in wire.unflatten(buffer, metadata).items()}

    async def finish_update(self, request):
        version = (await request.json()).get("weight_version")
        self.updating = False
        if version is not None:
            self.scheduler.weight_version = str(version)
        return web.json_response({"message": "Weight update finished"})

    async def update_weight_version(self, request):
        version = (await request.json()).get("new_version")
        self.scheduler.weight_version = str(version)
        return web.json_response({"success": True, "new_version": version})
