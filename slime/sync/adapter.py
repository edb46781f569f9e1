"""Adapter-only weight sync (`model.lora` with `sync_merged: false`): the policy's LoRA adapter moves, and so do the
few base weights trained beside it (`model.lora.train_params`, RMSNorm gains); the rest of the base stays as the
engines loaded it (docs/models.md#lora).

The trainer exports both (`TrainBackend.export_adapter`): the adapter under peft's saved names
(`base_model.model.<HF module>.lora_A.weight` / `lora_B.weight`), each trained base weight under its HF name
(`model.norm.weight`): peft's `modules_to_save`, which no engine's LoRA adapter holds. A push pauses and flushes
every engine as any sync does, then, per engine: the trained base weights into its base model through its own
update of named weights (none without train_params; a partial update touches only the names given: SGLang's
`load_weights`, vLLM's layerwise reload), unload the adapter it holds (`/unload_lora_adapter`), load the new one
under the same name in one request (`/load_lora_adapter_from_tensors`: SGLang 0.5.23 loads an adapter whole, so the
buckets are packed into one flattened bucket, `tp_worker.py:load_lora_adapter_from_tensors`), stamp the weight
version (`/update_weight_version`: the LoRA routes carry none), and continue. The base weights go first: vLLM drops
every loaded adapter when it reloads base weights (`gpu_model_runner.py:reload_weights`, `reset_lora_state`). Every
generation request names the adapter (`lora_path`), and the engines stay paused until all of it has loaded, so no
request runs on the base, on half an adapter or on the old gains. Tensor mode hands both over in memory (colocated
engines), disk mode as files.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext, WeightMismatchError, WeightSync
from slime.sync.push_ledger import SERVING_DTYPES
from slime.sync.tensor import TPSizes, packed
from slime.wire import bucket_codec
from slime.wire.tensors import Bucket, bucket_nbytes, sha256, weight_checksum

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."  # peft's saved names: every adapter tensor's, never a base weight's


def split_trained(tensors: Bucket) -> tuple[Bucket, Bucket]:
    """(the adapter's tensors, by peft's names; the trained base weights, by HF names) of an exported push."""
    adapter = [(name, t) for name, t in tensors if name.startswith(PEFT_PREFIX)]
    base = [(name, t) for name, t in tensors if not name.startswith(PEFT_PREFIX)]
    return adapter, base


class AdapterSync(WeightSync):
    """The per-engine protocol of an adapter push; a subclass moves the tensors (`_deliver`)."""

    bracketed = False  # SGLang's LoRA loads need no weight-update session (the base weights open their own)
    pushes_base = False  # the base stays as the engines loaded it, but for the trained base weights

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        if context.adapter is None:
            raise ValueError(f"{type(self).__name__} needs SyncContext.adapter (the peft config of the synced adapter)")
        self.trained_base: Bucket = []  # the last push's trained base weights (check_pushed compares them)

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        whole = [pair for bucket in buckets for pair in bucket]  # SGLang loads an adapter whole, in one request
        adapter, self.trained_base = split_trained(whole)
        self._deliver(adapter, self.trained_base, weight_version)
        return bucket_nbytes(whole)

    def _deliver(self, adapter: Bucket, base: Bucket, weight_version: str) -> None:
        """Have every engine take `base` into its base model and load `adapter` (`_load_into`)."""
        raise NotImplementedError

    def _load_into(
        self, engine, weight_version: str, load: Callable[..., object], *args, update_base: Callable[[], object] | None
    ) -> None:
        """`update_base()` (the engine takes the trained base weights; None: there are none), unload the engine's
        previous adapter, `load(*args)` the new one (an engine's load call), and stamp the version. The unload is always
        asked: a sync reconnected after an engine restart cannot tell the engines that hold the adapter from the
        fresh ones, which refuse it."""
        if update_base is not None:
            update_base()
        try:
            engine.unload_lora_adapter(self.context.adapter.name)
        except EngineHTTPError as exc:
            logger.info("%s held no adapter to unload: %s", engine.url, exc)
        load(*args)
        engine.update_weight_version(weight_version)

    def check_pushed(self) -> None:
        """The engines agree (`WeightSync.check_pushed`), and every TP rank of every engine holds each trained base
        weight as the trainer sent it: its `/weights_checker` checksum is that of the trainer's tensor in one of the
        serving dtypes (SGLang's CPU hash, `slime.wire.tensors.weight_checksum`)."""
        replies = self.check_engines_agree()
        wanted = {name: {weight_checksum(t.to(d)) for d in SERVING_DTYPES} for name, t in self.trained_base}
        for url, reply in replies.items():
            for rank in reply.get("ranks") or []:
                held = rank.get("checksums") or {}
                differ = sorted(name for name, sums in wanted.items() if held.get(name) not in sums)
                if differ:
                    raise WeightMismatchError(
                        f"{url}: trained base weights {differ} differ from the trainer's after the sync "
                        "(debug.check_weight_update_equal)"
                    )
        if wanted:
            logger.info("%d trained base weights match the trainer's on %d engines", len(wanted), len(replies))


def sha256_of(tensors: Bucket) -> dict[str, str]:
    """{name: sha256 of the tensor's bytes}: SGLang's `expected_checksums` of an adapter (`slime.wire.tensors.sha256`)."""
    return {name: sha256(tensor) for name, tensor in tensors}


class TensorAdapterSync(AdapterSync):
    """`rollout.weight_sync.mode=tensor`: the adapter in one shared-memory (CPU) or CUDA IPC flattened bucket, the
    trained base weights in another, loaded in a weight-update session (`/update_weights_from_tensor` between
    `/begin_weight_update` and `/end_weight_update`, which SGLang requires); with `debug.check_weight_update_equal`
    every engine checks each adapter tensor it loaded against the trainer's sha256, and each base weight is compared
    after the push (`check_pushed`)."""

    mode = "tensor"

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        self.tp_sizes = TPSizes()

    def _deliver(self, adapter: Bucket, base: Bucket, weight_version: str) -> None:
        synced = self.context.adapter
        checksums = sha256_of(adapter) if self.context.check_weight_update_equal or self.context.verify else None
        # the buffers live until every engine copied them
        with packed(adapter) as (flat, metadata), packed(base) as (base_flat, base_metadata):
            for engine in self.engines:
                # an item per reader: a shared CPU buffer counts one reader per serialisation (torch's file_system
                # sharing), and each reader's release counts it down
                readers = self.tp_sizes.of(engine)
                items = [bucket_codec.encode(flat, metadata) for _ in range(readers)]
                load = functools.partial(engine.load_lora_adapter_from_tensors, expected_checksums=checksums)
                update_base = None
                if base:
                    update_base = functools.partial(self._update_base, engine, (base_flat, base_metadata), readers)
                self._load_into(
                    engine, weight_version, load, synced.name, synced.config, items, update_base=update_base
                )

    def _update_base(self, engine, base: tuple[torch.Tensor, list], readers: int) -> None:
        """The packed trained base weights (buffer, metadata) into `engine`'s base model, an item per TP rank, in a
        session of their own; a failed load still closes it (the next push could not open one)."""
        engine.begin_weight_update()
        try:
            engine.update_weights_from_tensor([bucket_codec.encode(*base) for _ in range(readers)])
        except BaseException:
            self._end_sessions([engine])
            raise
        engine.finish_weight_update(None)


class DiskAdapterSync(AdapterSync):
    """`rollout.weight_sync.mode=disk`: a peft adapter directory (adapter_config.json, adapter_model.safetensors) at
    `<work_dir>/weights/adapter_v<N>`, which every engine loads (`/load_lora_adapter`), and the trained base weights
    in its `trained_params/model.safetensors` alone (no config.json: not a checkpoint), which every engine loads
    first (`/update_weights_from_disk`: SGLang's and vLLM's loaders load the names a directory holds). A directory
    stays until the next push has replaced it in every engine (vLLM reads the adapter's files at the first request
    naming it: `lora/worker_manager.py:_load_adapter`), then goes unless `rollout.weight_sync.keep`; `close` removes
    the last. It must be visible to every engine's node."""

    mode = "disk"
    BASE_DIR = "trained_params"  # the trained base weights' directory inside the adapter's

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        self.served: Path | None = None  # the directory the engines' adapter was loaded from

    @property
    def root(self) -> Path:
        return Path(self.context.work_dir) / "weights"

    def _deliver(self, adapter: Bucket, base: Bucket, weight_version: str) -> None:
        synced = self.context.adapter
        path = self.root / f"adapter_v{int(weight_version):06d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps(synced.config, indent=2))
        _save(adapter, path / "adapter_model.safetensors")
        base_dir = path / self.BASE_DIR
        if base:
            base_dir.mkdir(exist_ok=True)
            _save(base, base_dir / "model.safetensors")
        for engine in self.engines:
            update_base = None
            if base:
                flush = not self.keeps_requests  # an in-place pause holds requests: SGLang's flush would fail the call
                update_base = functools.partial(engine.update_weights_from_disk, str(base_dir), flush_cache=flush)
            self._load_into(
                engine, weight_version, engine.load_lora_adapter, synced.name, str(path), update_base=update_base
            )
        previous, self.served = self.served, path
        if previous is not None and previous != path and not self.context.keep:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        if not self.context.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def _save(tensors: Bucket, file: Path) -> None:
    save_file({name: t.detach().to("cpu").contiguous() for name, t in tensors}, str(file), metadata={"format": "pt"})
