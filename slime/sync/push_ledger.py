"""What one push carried, as the engines will hold it: the digest of every engine tensor, recorded while the buckets
pass on their way out (`PushLedger.watch`), in every dtype an engine may serve in, with the HF tensors and buckets
it came from. slime.sync.verify compares the engines' reports with it.

A fused engine module (vLLM's `qkv_proj`) is the concatenation of its HF modules' tensors, and the embedding and LM
head are padded to the engine's row multiple. The trainer digests each tensor as the engine kind reports it
(`EngineClient.digest_hash`): the built-in engine's block sums computed where the weights live
(`slime.wire.weight_digest`), SGLang's CPU hash and vLLM's sha256 over the bytes on the host (on a bucket's
tensors at once, on HASH_THREADS threads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from slime.engine.client import SGLANG_CPU_HASH
from slime.wire import weight_digest
from slime.wire.tensors import Bucket

EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
# An engine holds what it loads in its serving dtype, which the trainer does not know before the first push
SERVING_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HASH_THREADS = min(8, os.cpu_count() or 1)
HOST_KEPT_BYTES = 1 << 30  # host tensors a push holds for its check after the transfer; past it, digested beside it


def host_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes on the host, flat, as the engines' checkers read them."""
    return memoryview(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())


def _sha256(tensor: torch.Tensor) -> bytes:
    return hashlib.sha256(host_bytes(tensor)).digest()


def sha256_digests(tensors: Sequence[torch.Tensor], pool: ThreadPoolExecutor | None, hashed: str) -> list[str]:
    """The engines' host-side digests of `tensors` (hashlib lets go of the GIL: the pool's threads hash together)."""
    raw = list((pool.map if pool is not None else map)(_sha256, tensors))
    if hashed == SGLANG_CPU_HASH:  # the first 8 bytes, big-endian, as 16 hex digits
        return [f"{int.from_bytes(d[:8], byteorder='big', signed=False):016x}" for d in raw]
    return [d.hex() for d in raw]


def digests_of(tensors: Sequence[torch.Tensor], hashed: str, pool: ThreadPoolExecutor | None = None) -> list[str]:
    """`tensors`' digests as an engine that reports `hashed` digests makes them."""
    if hashed == weight_digest.DIGEST:
        return weight_digest.digests(tensors)
    if hashed in ("sha256", SGLANG_CPU_HASH):
        return sha256_digests(tensors, pool, hashed)
    raise ValueError(f"no digest named {hashed!r}: the engine's weights cannot be verified")


def as_served(tensor: torch.Tensor, dtypes: Sequence[torch.dtype]) -> dict[str, torch.Tensor]:
    """{dtype name: the tensor as an engine serving in that dtype holds it}: a floating tensor in each of `dtypes`
    (an engine casts what it loads to its own dtype, which the trainer learns from the first push), others as
    they are."""
    if not tensor.is_floating_point():
        return {"": tensor}
    return {str(d): tensor if tensor.dtype == d else tensor.to(d) for d in dtypes}


@dataclasses.dataclass(frozen=True)
class Pushed:
    """What one engine tensor should hold: {dtype name: its digest in that dtype}, the HF tensors it is made of, and
    their buckets."""

    digests: dict[str, str]
    sources: tuple[str, ...]
    buckets: tuple[int, ...]


@dataclasses.dataclass
class _Fusing:
    """The parts of one fused engine tensor seen so far: {part index: (HF name, tensor, bucket)}."""

    count: int
    parts: dict[int, tuple[str, torch.Tensor, int]] = dataclasses.field(default_factory=dict)


class PushLedger:
    """The digests of one push's tensors in an engine layout: `hashed` (the engines' digest,
    `EngineClient.digest_hash`), `packed` (their fused modules, `EngineClient.packed_modules`), `vocab_padding`
    (their embedding's row multiple), `tied` (the model ties its LM head to its embedding), `dtypes` (the floating
    dtypes the engines may serve in)."""

    def __init__(
        self,
        *,
        hashed: str,
        packed: dict[str, tuple[str, ...]],
        tied: bool,
        dtypes: Sequence[torch.dtype],
        vocab_padding: int = 1,
    ):
        self.hashed, self.tied, self.dtypes, self.vocab_padding = hashed, tied, tuple(dtypes), vocab_padding
        self.part_of = {hf: (fused, i, len(parts)) for fused, parts in packed.items() for i, hf in enumerate(parts)}
        self.pushed: dict[str, Pushed] = {}
        self.fusing: dict[str, _Fusing] = {}
        self.buckets = 0
        self.seconds = 0.0  # spent digesting (beside the transfer)
        self._jobs: ThreadPoolExecutor | None = None  # digests one bucket at a time, in order
        self._hashing: ThreadPoolExecutor | None = None  # the host hashes' threads
        self._pending: list[Future] = []  # each bucket's digesting job
        self._later: list[list] = []  # host buckets' engine tensors, digested by wait()
        self._unfolded: list[tuple] = []  # per bucket: ([(engine tensor's entry, dtype name)], their BlockSums)
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # where a CUDA bucket's block sums are launched
        self._kept_bytes = 0  # their bytes
        # the built-in engine's digests of tensors it holds as they come: launched on the transfer's own thread
        self._in_place = hashed == weight_digest.DIGEST and not self.part_of and len(self.dtypes) == 1
        self._read: list[tuple[torch.cuda.Event, list[torch.Tensor]]] = []  # tensors held until their sums are read

    def watch(self, buckets: Iterable[Bucket]) -> Iterator[Bucket]:
        """The same buckets, each handed on at once. A bucket on an accelerator is digested meanwhile, on a thread of
        the ledger's: its reductions are launched on a stream of the ledger's while the transfer moves the bucket, and
        `wait()` folds them; the transfer waits only for the launches of the bucket before the one it hands on (at
        most two buckets are held for their digests; an exporter hands each bucket's tensors anew, or parameters a
        push does not change). One on the host is kept for `wait()` to digest once the transfer is done, where its
        reads would otherwise take the transfer's cores (up to HOST_KEPT_BYTES: then as an accelerator's). `wait()`
        ends the digesting."""
        self._hashing = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="push-ledger-hash")
        self._jobs = ThreadPoolExecutor(1, thread_name_prefix="push-ledger")
        try:
            for index, bucket in enumerate(buckets):
                if self._launch_in_place(bucket, index):
                    self.buckets = index + 1
                    yield bucket
                    continue
                whole = list(self._engine_tensors(bucket, index))
                later = self._keep_for_later(whole)
                self._pending += [] if later else [self._jobs.submit(self._digest, whole)]
                self._later += [whole] if later else []
                self.buckets = index + 1
                yield bucket
                if len(self._pending) > 1:
                    self._pending[-2].result()
        finally:
            self._jobs.shutdown(wait=False)  # wait() awaits the last bucket's, beside generation where it is deferred

    def _keep_for_later(self, whole: list[tuple[str, torch.Tensor, tuple, tuple]]) -> bool:
        """Whether a bucket's engine tensors wait for `wait()`: on the host, while those kept stay within
        HOST_KEPT_BYTES (an exporter's fresh copies are held until then; past it they are digested beside the
        transfer)."""
        if not all(tensor.device.type == "cpu" for _, tensor, _, _ in whole):
            return False
        nbytes = sum(tensor.numel() * tensor.element_size() for _, tensor, _, _ in whole)
        if self._kept_bytes + nbytes > HOST_KEPT_BYTES:
            return False
        self._kept_bytes += nbytes
        return True

    def wait(self) -> None:
        """Digest what waits and block until every bucket handed on is digested (a job's error is raised here, or to
        the transfer as it drew a later bucket)."""
        if self._jobs is not None:
            self._jobs.shutdown(wait=True)
        for job in self._pending:
            job.result()
        later, self._later = self._later, []
        for whole in later:
            self._digest(whole)
        unfolded, self._unfolded = self._unfolded, []
        if unfolded:
            start = time.perf_counter()
            for device, stream in self._streams.items():
                torch.cuda.current_stream(device).wait_stream(stream)
            self._read = []  # the current stream now follows their reads: their memory may be handed on
            texts = weight_digest.folded([sums for _, sums in unfolded])
            for (entry, dtype), text in zip((e for entries, _ in unfolded for e in entries), texts):
                self._record(entry, dtype, text)
            self.seconds += time.perf_counter() - start
        if self._hashing is not None:
            self._hashing.shutdown(wait=True)

    def _digest(self, whole: list[tuple[str, torch.Tensor, tuple, tuple]]) -> None:
        """Record the digests of one bucket's engine tensors, in every dtype the engines may serve in."""
        start = time.perf_counter()
        served = [(entry, dtype, t) for entry in whole for dtype, t in as_served(entry[1], self.dtypes).items()]
        if self.hashed == weight_digest.DIGEST and all(t.device.type != "cpu" for _, _, t in served):
            # launched here and folded by wait(): no wait for the accelerator inside the transfer
            for device in dict.fromkeys(t.device for *_, t in served):
                group = [(entry, dtype, t) for entry, dtype, t in served if t.device == device]
                self._unfolded.append(([(e, d) for e, d, _ in group], self._launch([t for *_, t in group])))
        else:
            texts = digests_of([t for _, _, t in served], self.hashed, self._hashing)
            for (entry, dtype, _), text in zip(served, texts):
                self._record(entry, dtype, text)
        self.seconds += time.perf_counter() - start

    def _launch_in_place(self, bucket: Bucket, index: int) -> bool:
        """Launch a bucket's block sums here, on the transfer's thread, where none of its tensors needs a copy or a
        view to be digested as the engine holds it (the built-in engine's digests, one serving dtype that every
        floating tensor already has, contiguous CUDA tensors of one device with 2-, 4- or 8-byte elements, no fused
        module, no padded rows); False: the bucket goes the general way. The host's work is a few attribute reads a
        tensor, and no thread of the ledger's competes with the transfer's for the interpreter meanwhile. The tensors
        are held until their sums are read (no `record_stream` per tensor)."""
        tensors = [t for _, t in bucket]
        if not self._in_place or not tensors or not self._as_held(bucket):
            return False
        start = time.perf_counter()
        with self._ledger_stream(tensors[0].device) as stream:
            sums = weight_digest.block_sums_in_place(tensors)
            if sums is None:  # no Triton kernel on this device
                return False
            read = torch.cuda.Event()
            read.record(stream)
        while self._read and self._read[0][0].query():
            self._read.pop(0)
        self._read.append((read, tensors))
        entries = [((name, None, (name,), (index,)), self._served_as(t)) for name, t in bucket]
        self._unfolded.append((entries, sums))
        self.seconds += time.perf_counter() - start
        return True

    def _as_held(self, bucket: Bucket) -> bool:
        """Whether every tensor of the bucket is, as it is, what an engine serving in the one known dtype holds."""
        served, device = self.dtypes[0], bucket[0][1].device
        if device.type != "cuda":
            return False
        for name, t in bucket:
            if t.device != device or not t.is_contiguous() or t.element_size() == 1:
                return False
            if t.is_floating_point() and t.dtype != served:
                return False
            if self.vocab_padding > 1 and name in (EMBEDDING, LM_HEAD):
                return False
        return True

    def _served_as(self, tensor: torch.Tensor) -> str:
        """The key of a tensor's digest in `Pushed.digests` (as `as_served` names it)."""
        return str(tensor.dtype) if tensor.is_floating_point() else ""

    @contextlib.contextmanager
    def _ledger_stream(self, device: torch.device) -> Iterator[torch.cuda.Stream]:
        """The ledger's own CUDA stream on `device` as the current one, once the transfer's work queued so far is:
        what is launched there reads beside the next bucket's copies instead of after them."""
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        stream = self._streams[device]
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            yield stream

    def _launch(self, tensors: list[torch.Tensor]) -> weight_digest.BlockSums:
        """The block sums of a bucket's tensors (one device), on a CUDA device launched on the ledger's stream."""
        device = tensors[0].device
        if device.type != "cuda":
            return weight_digest.block_sums_of(tensors)
        with self._ledger_stream(device) as stream:
            sums = weight_digest.block_sums_of(tensors)
        for t in tensors:  # the caching allocator must not hand their memory on before the stream read it
            t.record_stream(stream)
        return sums

    def _record(self, entry: tuple[str, torch.Tensor, tuple, tuple], dtype: str, text: str) -> None:
        name, _, sources, buckets_of = entry
        self.pushed.setdefault(name, Pushed({}, sources, buckets_of)).digests[dtype] = text

    def _engine_tensors(self, bucket: Bucket, index: int) -> Iterator[tuple[str, torch.Tensor, tuple, tuple]]:
        """(engine name, tensor as the engine holds it, HF sources, their buckets) of each engine tensor the bucket
        completes: a plain one at once, a fused one once all its parts arrived (concatenated along dim 0)."""
        for name, tensor in bucket:
            module, _, leaf = name.rpartition(".")
            owner, _, short = module.rpartition(".")
            if short not in self.part_of:
                yield name, self._padded(name, tensor), (name,), (index,)
                continue
            fused, part, count = self.part_of[short]
            engine_name = f"{owner}.{fused}.{leaf}" if owner else f"{fused}.{leaf}"
            parts = self.fusing.setdefault(engine_name, _Fusing(count))
            parts.parts[part] = (name, tensor, index)
            if len(parts.parts) == count:
                del self.fusing[engine_name]
                ordered = [parts.parts[i] for i in range(count)]
                whole = torch.cat(
                    [t.detach().reshape(t.shape[0], -1) if t.dim() else t.reshape(1) for _, t, _ in ordered]
                )
                yield engine_name, whole, tuple(n for n, _, _ in ordered), tuple(b for _, _, b in ordered)

    def _padded(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The embedding and LM head with zero rows up to the engine's row multiple."""
        if name in (EMBEDDING, LM_HEAD) and tensor.dim() == 2 and tensor.shape[0] % self.vocab_padding:
            return torch.cat([tensor, tensor.new_zeros(-tensor.shape[0] % self.vocab_padding, tensor.shape[1])])
        return tensor

    def expected(self, engine_name: str) -> Pushed | None:
        """What `engine_name` should hold after this push (None: the push did not carry it). A module wrapped for LoRA
        adapters holds its weight under `base_layer` (peft's and vLLM's LoRA layers)."""
        engine_name = engine_name.replace(".base_layer.", ".")
        if engine_name == LM_HEAD and LM_HEAD not in self.pushed and self.tied:
            return self.pushed.get(EMBEDDING)
        return self.pushed.get(engine_name)
