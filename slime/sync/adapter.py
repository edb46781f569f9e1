"""Adapter-only weight sync (`model.lora` with `sync_merged: false`): the policy's LoRA adapter moves, the frozen
base the engines loaded at start stays.

The trainer exports the adapter alone (`TrainBackend.export_adapter`: peft's saved names,
`base_model.model.<HF module>.lora_A.weight` / `lora_B.weight`). A push pauses and flushes every engine as any
sync does, then, per engine: unload the adapter it holds (`/unload_lora_adapter`), load the new one under the same
name in one request (`/load_lora_adapter_from_tensors`: SGLang 0.5.23 loads an adapter whole, so the buckets are
packed into one flattened bucket, `tp_worker.py:load_lora_adapter_from_tensors`), stamp the weight version
(`/update_weight_version`: the LoRA routes carry none), and continue. Every generation request names the adapter
(`lora_path`), so no request runs on the base or on half an adapter. Tensor mode hands the adapter over in memory
(colocated engines), disk mode as a peft adapter directory.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from safetensors.torch import save_file

from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext, WeightSync
from slime.sync.tensor import TPSizes, packed
from slime.wire import bucket_codec
from slime.wire.tensors import Bucket, bucket_nbytes, sha256

logger = logging.getLogger(__name__)


class AdapterSync(WeightSync):
    """The per-engine protocol of an adapter push; a subclass moves the tensors (`_deliver`)."""

    bracketed = False  # SGLang's LoRA loads need no weight-update session
    pushes_base = False  # the base stays as the engines loaded it

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        if context.adapter is None:
            raise ValueError(f"{type(self).__name__} needs SyncContext.adapter (the peft config of the synced adapter)")

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        whole = [pair for bucket in buckets for pair in bucket]  # SGLang loads an adapter whole, in one request
        self._deliver(whole, weight_version)
        return bucket_nbytes(whole)

    def _deliver(self, whole: Bucket, weight_version: str) -> None:
        """Have every engine load `whole` (the adapter's tensors) through `_load_into`."""
        raise NotImplementedError

    def _load_into(self, engine, weight_version: str, load: Callable[..., object], *args) -> None:
        """Unload the engine's previous adapter, `load(*args)` the new one (an engine's load call), and stamp the
        version. The unload is always asked: a sync reconnected after an engine restart cannot tell the engines that
        hold the adapter from the fresh ones, which refuse it."""
        try:
            engine.unload_lora_adapter(self.context.adapter.name)
        except EngineHTTPError as exc:
            logger.info("%s held no adapter to unload: %s", engine.url, exc)
        load(*args)
        engine.update_weight_version(weight_version)


def sha256_of(tensors: Bucket) -> dict[str, str]:
    """{name: sha256 of the tensor's bytes}: SGLang's `expected_checksums` of an adapter (`slime.wire.tensors.sha256`)."""
    return {name: sha256(tensor) for name, tensor in tensors}


class TensorAdapterSync(AdapterSync):
    """`rollout.weight_sync.mode=tensor`: the adapter in one shared-memory (CPU) or CUDA IPC flattened bucket; with
    `debug.check_weight_update_equal` every engine checks each tensor it loaded against the trainer's sha256."""

    mode = "tensor"

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        self.tp_sizes = TPSizes()

    def _deliver(self, whole: Bucket, weight_version: str) -> None:
        adapter = self.context.adapter
        checksums = sha256_of(whole) if self.context.check_weight_update_equal else None
        with packed(whole) as (flat, metadata):  # the buffer lives until every engine copied it
            for engine in self.engines:
                # an item per reader: a shared CPU buffer counts one reader per serialisation (torch's file_system
                # sharing), and each reader's release counts it down
                items = [bucket_codec.encode(flat, metadata) for _ in range(self.tp_sizes.of(engine))]
                load = functools.partial(engine.load_lora_adapter_from_tensors, expected_checksums=checksums)
                self._load_into(engine, weight_version, load, adapter.name, adapter.config, items)


class DiskAdapterSync(AdapterSync):
    """`rollout.weight_sync.mode=disk`: a peft adapter directory (adapter_config.json, adapter_model.safetensors) at
    `<work_dir>/weights/adapter_v<N>`, which every engine loads (`/load_lora_adapter`). A directory stays until the
    next push has replaced it in every engine (vLLM reads the files at the first request naming the adapter:
    `lora/worker_manager.py:_load_adapter`), then goes unless `rollout.weight_sync.keep`; `close` removes the last.
    It must be visible to every engine's node."""

    mode = "disk"

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        self.served: Path | None = None  # the directory the engines' adapter was loaded from

    @property
    def root(self) -> Path:
        return Path(self.context.work_dir) / "weights"

    def _deliver(self, whole: Bucket, weight_version: str) -> None:
        adapter = self.context.adapter
        path = self.root / f"adapter_v{int(weight_version):06d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps(adapter.config, indent=2))
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in whole}
        save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
        for engine in self.engines:
            self._load_into(engine, weight_version, engine.load_lora_adapter, adapter.name, str(path))
        previous, self.served = self.served, path
        if previous is not None and previous != path and not self.context.keep:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        if not self.context.keep:
            shutil.rmtree(self.root, ignore_errors=True)
