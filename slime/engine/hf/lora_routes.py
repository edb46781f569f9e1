"""The hf engine's LoRA and weight-version routes, with SGLang 0.5.23's bodies and replies.

    POST /load_lora_adapter               {lora_name, lora_path, pinned?}   (`io_struct.LoadLoRAAdapterReqInput`)
    POST /load_lora_adapter_from_tensors  {lora_name, config_dict, serialized_named_tensors: [one per TP rank],
                                           load_format?: "flattened_bucket" | None, pinned?, ...}
                                          (`LoadLoRAAdapterFromTensorsReqInput`; `tp_worker.py:
                                          load_lora_adapter_from_tensors` reads item tp_rank; this engine
                                          takes the flattened bucket, `slime.wire.bucket_codec`; with
                                          expected_checksums {name: sha256} each tensor is checked first)
    POST /unload_lora_adapter             {lora_name}                       (`UnloadLoRAAdapterReqInput`)
    POST /update_weight_version           {new_version, abort_all_requests = true} (`UpdateWeightVersionReqInput`)

LoRA replies are `LoRAUpdateOutput` ({success, error_message, loaded_adapters}), HTTP 400 when not successful
(`http_server.py`); without `--enable-lora` every LoRA route fails as SGLang's tokenizer manager answers it.
Loads and unloads run on the model thread, between batches.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from slime.engine.hf.generator import GenerationError
from slime.engine.hf.http_util import json_body
from slime.engine.hf.lora_slot import NOT_ENABLED, LoRASlot
from slime.wire import bucket_codec
from slime.wire.tensors import sha256

logger = logging.getLogger("slime.engine.hf.lora_routes")


class LoRARoutes:
    """HTTP handlers over the engine's `slot` (None: started without --enable-lora) and `scheduler`."""

    def __init__(self, slot: LoRASlot | None, scheduler):
        self.slot = slot
        self.scheduler = scheduler

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/load_lora_adapter", self.load_from_dir),
            web.post("/load_lora_adapter_from_tensors", self.load_from_tensors),
            web.post("/unload_lora_adapter", self.unload),
            web.post("/update_weight_version", self.update_weight_version),
        ]

    async def _lora_call(self, what: str, request: web.Request, change) -> web.Response:
        """Run `change(slot, body)` on the model thread; SGLang's LoRAUpdateOutput either way."""
        try:
            body = await json_body(request)
            if self.slot is None:
                raise GenerationError(NOT_ENABLED)
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise GenerationError("lora_name must be a non-empty string")
            await self.scheduler.run_exclusive(change, self.slot, body)
        except (GenerationError, ValueError) as exc:
            logger.warning("%s failed: %s", what, exc)
            return web.json_response({"success": False, "error_message": str(exc), "loaded_adapters": None}, status=400)
        logger.info("%s %r", what, name)
        loaded = {self.slot.loaded: self.slot.loaded} if self.slot.loaded else {}
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": loaded})

    async def load_from_dir(self, request: web.Request) -> web.Response:
        def change(slot: LoRASlot, body: dict) -> None:
            slot.load_dir(body["lora_name"], str(body.get("lora_path") or ""))

        return await self._lora_call("load_lora_adapter", request, change)

    async def load_from_tensors(self, request: web.Request) -> web.Response:
        def change(slot: LoRASlot, body: dict) -> None:
            config = body.get("config_dict")
            if not isinstance(config, dict):
                raise GenerationError("config_dict must be the adapter's adapter_config.json as an object")
            slot.load(body["lora_name"], config, self.open_tensors(body))

        return await self._lora_call("load_lora_adapter_from_tensors", request, change)

    def open_tensors(self, body: dict) -> dict[str, Any]:
        """The adapter's tensors as TP rank 0 receives them: its item opened, then checked against the body's
        `expected_checksums` if any (a server running SGLang's own intake replaces this)."""
        tensors = _tensors(body)
        if body.get("expected_checksums") is not None:
            _check_sums(tensors, body["expected_checksums"])
        return tensors

    async def unload(self, request: web.Request) -> web.Response:
        return await self._lora_call("unload_lora_adapter", request, lambda slot, body: slot.unload(body["lora_name"]))

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        version = body.get("new_version")
        if version is None:
            return web.json_response({"success": False, "message": "new_version is required"}, status=400)
        if body.get("abort_all_requests", True):
            self.scheduler.abort(abort_all=True)
        self.scheduler.weight_version = str(version)
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": str(version)}
        )


def _check_sums(tensors: dict[str, Any], expected: dict[str, str]) -> None:
    """SGLang's check of a loaded adapter (`tp_worker.py:load_lora_adapter_from_tensors`, `expected_checksums`): the
    sha256 of each tensor's bytes equals the sender's, none missing, none extra; else its [LORA-CHECK] error (which
    kills SGLang's scheduler; this engine answers 400)."""
    got = {name: sha256(tensor) for name, tensor in tensors.items()}
    mismatch = [name for name, want in expected.items() if name in got and got[name] != want]
    missing = [name for name in expected if name not in got]
    extra = [name for name in got if name not in expected]
    if mismatch or missing or extra:
        raise GenerationError(
            f"[LORA-CHECK] rank0 adapter sync MISMATCH of {len(expected)} expected: {len(mismatch)} value-diff "
            f"{mismatch[:5]}, {len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}"
        )
    logger.info("[LORA-CHECK] rank0 adapter sync OK: %d/%d tensors match (sha256)", len(expected), len(expected))


def _tensors(body: dict) -> dict[str, Any]:
    """TP rank 0's item of `serialized_named_tensors` ({name: tensor}), a flattened bucket."""
    items = body.get("serialized_named_tensors")
    if not isinstance(items, list) or not items:
        raise GenerationError("serialized_named_tensors must list one serialised item per engine TP rank")
    if body.get("load_format") != "flattened_bucket":
        raise GenerationError(f"load_format={body.get('load_format')!r} is not supported (flattened_bucket)")
    try:
        return {name: tensor.clone() for name, tensor in bucket_codec.reconstruct(*bucket_codec.decode(items[0]))}
    except Exception as exc:  # noqa: BLE001 - a bad payload is the caller's error
        raise GenerationError(f"cannot open the serialised adapter: {exc}") from exc
