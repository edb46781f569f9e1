"""SGLang's serialised flattened bucket: one item of `/update_weights_from_tensor`'s `serialized_named_tensors`.

What SGLang 0.5.23 reads (`sglang/srt/managers/tp_worker.py:deserialize_own_rank`, then
`sglang/srt/model_executor/model_runner_components/weight_updater.py:_update_weights_from_flattened_bucket`):
TP rank i takes item i, base64-decodes it and unpickles it with `MultiprocessingSerializer.deserialize`
(`sglang/srt/utils/common.py`, a `SafeUnpickler` that admits only listed globals) into

    {"flattened_tensor": <uint8 tensor, shared>, "metadata": [FlattenedTensorMetadata, ...]}

with `FlattenedTensorMetadata(name, shape: torch.Size, dtype: torch.dtype, start_idx, end_idx, numel)` from
`sglang/srt/weight_sync/tensor_bucket.py` (byte offsets into the flat tensor). The tensor travels as torch's
multiprocessing reduction (`ForkingPickler`): a CUDA IPC handle whose device is the GPU's UUID, as SGLang's
`monkey_patch_torch_reductions` writes it (`sglang/srt/utils/patch_torch.py`; the engine maps the UUID to
its own device index, whatever CUDA_VISIBLE_DEVICES says), or on CPU a shared-memory segment named through
torch's file_system strategy (`rebuild_storage_filename`: the only CPU form an unrelated process can open).

`encode` writes that pickle without importing sglang (the metadata class is written under SGLang's module
path); `decode` reads it the way SGLang does, with the same allow-list, into this module's
`FlattenedTensorMetadata`; `describe` reads an item without mapping its memory (what a vLLM engine is sent).
A buffer reused for many buckets is shared once (`share_once`): every item encoded from it then names the same
CUDA IPC handle and reference counter, which only a reader that keeps its mapping (`slime.wire.kept_mappings`)
may be sent.
"""

from __future__ import annotations

import base64
import copyreg
import dataclasses
import io
import os
import pickle
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing
from torch.multiprocessing import reductions

SGLANG_METADATA_CLASS = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")


@dataclasses.dataclass
class FlattenedTensorMetadata:
    """One tensor of a flattened bucket: bytes `start_idx` to `end_idx` (exclusive) of the flat uint8 tensor."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int  # bytes (end_idx - start_idx), as SGLang counts them


def bucket_metadata(bucket: Sequence[tuple[str, torch.Tensor]]) -> list[FlattenedTensorMetadata]:
    """The metadata of `bucket`'s tensors laid out in order as bytes, each starting at a multiple of its element
    size (a byte view is reinterpreted in place, which needs that alignment; one dtype packs back to back)."""
    out, offset = [], 0
    for name, tensor in bucket:
        size = tensor.element_size()
        offset = -(-offset // size) * size
        nbytes = tensor.numel() * size
        out.append(FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, offset, offset + nbytes, nbytes))
        offset += nbytes
    return out


def flatten(bucket: Sequence[tuple[str, torch.Tensor]], flat: torch.Tensor, metadata) -> None:
    """Copy `bucket`'s tensors into the uint8 tensor `flat` (at least `metadata[-1].end_idx` bytes) where
    `metadata` (`bucket_metadata(bucket)`) places them, as one multi-tensor copy: a copy launched per tensor spends
    more time launching than copying on a GPU (310 tensors of the 1.7B shape)."""
    places = [flat[m.start_idx : m.end_idx].view(m.dtype).view(t.shape) for (_, t), m in zip(bucket, metadata)]
    if places:  # an empty bucket (a TP rank with nothing to load) has nothing to copy
        torch._foreach_copy_(places, [t.detach() for _, t in bucket])


def reconstruct(flat: torch.Tensor, metadata: Sequence[FlattenedTensorMetadata]) -> list[tuple[str, torch.Tensor]]:
    """Views of `flat` as the named tensors (`FlattenedTensorBucket.reconstruct_tensors`)."""
    out = []
    for meta in metadata:
        if not 0 <= meta.start_idx <= meta.end_idx <= flat.numel():
            raise ValueError(
                f"tensor {meta.name!r}: bytes {meta.start_idx}..{meta.end_idx} outside the {flat.numel()}-byte bucket"
            )
        out.append((meta.name, flat[meta.start_idx : meta.end_idx].view(meta.dtype).reshape(meta.shape)))
    return out


# ------------------------------------------------------------------------------------------- producing
def _device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def _reduce_tensor_by_uuid(tensor: torch.Tensor):
    """torch's reduction, with a CUDA tensor's device index (argument 6) replaced by its GPU's UUID."""
    rebuild, args = reductions.reduce_tensor(tensor)
    if rebuild is reductions.rebuild_cuda_tensor and isinstance(args[6], int):
        args = (*args[:6], _device_uuid(args[6]), *args[7:])
    return rebuild, args


def _reduce_metadata(meta: FlattenedTensorMetadata):
    """A call of the metadata class with its fields in SGLang's order (its dataclass takes them positionally)."""
    return FlattenedTensorMetadata, (meta.name, meta.shape, meta.dtype, meta.start_idx, meta.end_idx, meta.numel)


def _class_prologue() -> bytes:
    """Opcodes that push SGLang's metadata class by its module path, keep it in memo slot 0 and pop it. The C
    pickler names a class only where it can import it (never SGLang's here), so it is handed slot 0 as the
    class (`_SGLangPickler.memo`) and writes each metadata item as a call of what slot 0 holds."""
    out = bytearray(pickle.PROTO + bytes([4]))
    for text in SGLANG_METADATA_CLASS:
        raw = text.encode()
        out += pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw
    return bytes(out + pickle.STACK_GLOBAL + pickle.MEMOIZE + pickle.POP)


class _SGLangPickler(pickle.Pickler):
    """The C pickler with ForkingPickler's reductions (shared tensors), CUDA devices by UUID, and this module's
    metadata class written as SGLang's: `dump` writes `_class_prologue` first and starts its memo from it.
    `fixed`: (a tensor, the reduction it is written as) for a buffer shared once (`share_once`)."""

    def __init__(self, file: io.BytesIO, fixed: tuple[torch.Tensor, Any] | None = None):
        super().__init__(file, protocol=4)
        self.dispatch_table = copyreg.dispatch_table.copy()
        self.dispatch_table.update(ForkingPickler._extra_reducers)
        reduce = _reduce_tensor_by_uuid
        if fixed is not None:

            def reduce(tensor, _fixed=fixed):
                return _fixed[1] if tensor is _fixed[0] else _reduce_tensor_by_uuid(tensor)

        for cls in (torch.Tensor, torch.nn.Parameter):
            self.dispatch_table[cls] = reduce
        self.dispatch_table[FlattenedTensorMetadata] = _reduce_metadata
        self.file = file

    def dump(self, obj) -> None:
        self.file.write(_class_prologue())
        self.memo = {id(FlattenedTensorMetadata): (0, FlattenedTensorMetadata)}
        super().dump(obj)


@contextmanager
def _file_system_sharing() -> Iterator[None]:
    """CPU storages shared by name (torch's file_system strategy) while the pickle is written: a file
    descriptor (the default strategy) can only be passed to a child of this process."""
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def encode(flat: torch.Tensor, metadata: Sequence[FlattenedTensorMetadata], *, shared: Any = None) -> str:
    """The base64 item for one TP rank (`MultiprocessingSerializer.serialize(..., output_str=True)`). The
    caller keeps `flat` alive until the engine has replied: the item only names its memory. `shared`:
    `share_once(flat)`, for a buffer every item of which names one share of it."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"a flattened bucket is a 1-D uint8 tensor, got {flat.dtype} of shape {list(flat.shape)}")
    buffer = io.BytesIO()
    with _file_system_sharing():
        if not flat.is_cuda:
            flat.share_memory_()
        fixed = (flat, shared) if shared is not None else None
        _SGLangPickler(buffer, fixed).dump({"flattened_tensor": flat, "metadata": list(metadata)})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def share_once(flat: torch.Tensor) -> Any:
    """`flat` shared for every item encoded from it (`encode(..., shared=)`): on a GPU its CUDA IPC reduction,
    made once, so every item names one handle and one reference counter (torch makes a new counter, event and
    wrapper of the storage at each share, which a buffer reused for every bucket would pile up); None on CPU,
    where each item is a share of its own (one reference a reader takes back, `rebuild_storage_filename`)."""
    if not flat.is_cuda:
        flat.share_memory_()
        return None
    return _reduce_tensor_by_uuid(flat)


def empty_bucket(device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[FlattenedTensorMetadata]]:
    """What a TP rank with nothing to load is sent (SGLang reconstructs no tensor from it)."""
    return torch.empty(0, dtype=torch.uint8, device=device), []


# ------------------------------------------------------------------------------------------- reading
def local_device_args(args: tuple) -> tuple:
    """torch's `rebuild_cuda_tensor` arguments with the device given as a GPU UUID (or an index) mapped to this
    process's index."""
    device = args[6]
    if isinstance(device, str):
        matches = [i for i in range(torch.cuda.device_count()) if _device_uuid(i) == device]
        if not matches:
            raise ValueError(f"no visible GPU has UUID {device} (is the engine on the trainer's GPUs?)")
        args = (*args[:6], matches[0], *args[7:])
    return args


def _rebuild_cuda_tensor(*args):
    """torch's rebuild with the device given as a GPU UUID (or an index) mapped to this process's index."""
    return reductions.rebuild_cuda_tensor(*local_device_args(args))


_ALLOWED = {
    ("builtins", name) for name in ("dict", "list", "tuple", "int", "float", "str", "bytes", "bool", "bytearray")
} | {
    ("copyreg", "__newobj__"),
    ("torch", "Size"),
    ("torch", "Tensor"),
    ("torch", "UntypedStorage"),
    ("torch.storage", "UntypedStorage"),
    ("torch.storage", "TypedStorage"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch.multiprocessing.reductions", "rebuild_tensor"),
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"),
    ("torch.multiprocessing.reductions", "rebuild_storage_filename"),
    ("torch.multiprocessing.reductions", "rebuild_storage_empty"),
}
_REPLACED = {
    SGLANG_METADATA_CLASS: FlattenedTensorMetadata,
    ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"): _rebuild_cuda_tensor,
    ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor,
}


class _Unpickler(pickle.Unpickler):
    """SGLang's SafeUnpickler allow-list, narrowed to what a flattened bucket holds; SGLang's classes and its
    patched CUDA rebuild are read as this module's (`rebuild_cuda`: the CUDA rebuild to call instead)."""

    rebuild_cuda: Any = None

    def find_class(self, module: str, name: str):
        if (module, name) in _REPLACED:
            found = _REPLACED[(module, name)]
            return self.rebuild_cuda if found is _rebuild_cuda_tensor and self.rebuild_cuda else found
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a weight bucket")


def _payload(item: str | bytes, unpickler: type[pickle.Unpickler], rebuild_cuda=None) -> dict[str, Any]:
    raw = base64.b64decode(item, validate=True)
    reader = unpickler(io.BytesIO(raw))
    reader.rebuild_cuda = rebuild_cuda
    payload = reader.load()
    if not isinstance(payload, dict) or not {"flattened_tensor", "metadata"} <= set(payload):
        raise ValueError("a flattened bucket item holds {'flattened_tensor', 'metadata'}")
    return payload


def decode(item: str | bytes, rebuild_cuda=None) -> tuple[torch.Tensor, list[FlattenedTensorMetadata]]:
    """(the producer's flat uint8 tensor mapped here, its metadata); read it before replying. `rebuild_cuda`:
    called with torch's `rebuild_cuda_tensor` arguments (the device as written) in place of the plain rebuild."""
    payload = _payload(item, _Unpickler, rebuild_cuda)
    return payload["flattened_tensor"], list(payload["metadata"])


@dataclasses.dataclass(frozen=True)
class _Rebuild:
    """A rebuild call read but not made: the function's name and its arguments."""

    function: str
    args: tuple


class _Describer(_Unpickler):
    def find_class(self, module: str, name: str):
        found = super().find_class(module, name)
        if module == "torch.multiprocessing.reductions" or found is _rebuild_cuda_tensor:
            return lambda *args, _name=name: _Rebuild(_name, args)
        return found


def describe(item: str | bytes) -> tuple[_Rebuild, list[FlattenedTensorMetadata]]:
    """An item's metadata and the rebuild call of its tensor, without opening any memory: `.function` is
    "rebuild_cuda_tensor" (`.args` as torch's, the device a GPU UUID) or "rebuild_tensor" (CPU; its storage
    argument is itself a `_Rebuild` of "rebuild_typed_storage" over "rebuild_storage_filename")."""
    payload = _payload(item, _Describer)
    return payload["flattened_tensor"], list(payload["metadata"])


def shm_segment(rebuild: _Rebuild) -> tuple[str, int, int]:
    """(the /dev/shm path, byte offset of the data in it, bytes) of a CPU item's shared segment, from
    `describe`'s rebuild call (torch's refcounted segments keep a header before the data)."""
    typed = rebuild.args[1]
    untyped = typed.args[0]
    if untyped.function != "rebuild_storage_filename":
        raise ValueError(f"not a shared-memory bucket: {untyped.function}")
    _cls, _manager, handle, size = untyped.args[:4]
    path = "/dev/shm" + handle.decode()
    return path, os.path.getsize(path) - int(size), int(size)


def cuda_rebuild_args(rebuild: _Rebuild) -> tuple[str, tuple]:
    """(the GPU's UUID, torch's `rebuild_cuda_tensor` arguments with this process's index of that GPU)."""
    uuid = rebuild.args[6]
    index = next(i for i in range(torch.cuda.device_count()) if _device_uuid(i) == uuid)
    return uuid, (*rebuild.args[:6], index, *rebuild.args[7:])
