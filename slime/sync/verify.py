"""Verified syncs (`rollout.weight_sync.verify`, on by default; docs/engines.md#verified-syncs).

Every push is checked after the engines loaded it, in every mode: as the buckets pass on their way out, the trainer
records each tensor's digest and the bucket that carried it (`PushLedger.watch`, before any transfer touches them);
once the engines closed their update sessions, each engine reports the digests of what it holds (its own weights
checker: `EngineClient.weight_digests`), and every tensor the push carried must match, in the engine's own layout:
a fused module (vLLM's `qkv_proj`) is the concatenation of its HF modules' tensors, and a tied LM head that the
engine holds as a tensor of its own must equal the embedding the push carried. So a byte changed in transit, a tensor
an engine never loaded, a tied head it did not reload and an adapter that never reached it all fail the push, naming
the engine, the buckets and the tensors (`WeightMismatchError`). An engine that cannot report its tensors whole (a
sharded one; SGLang hashing on a GPU) is compared with the other engines of its layout instead, and the log says so.

The trainer digests each tensor as the engine kind reports it (`EngineClient.digest_hash`): the built-in engine's
block sums computed where the weights live (`slime.wire.weight_digest`), SGLang's CPU hash and vLLM's sha256 over
the bytes on the host (on a bucket's tensors at once, on HASH_THREADS threads).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from slime.engine.client import SGLANG_CPU_HASH, EngineClient, EngineDigests
from slime.wire import weight_digest
from slime.wire.tensors import Bucket

logger = logging.getLogger(__name__)

EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
PEFT_PREFIX = "base_model.model."  # peft's saved names: every adapter tensor's, never a base weight's
# An engine holds what it loads in its serving dtype, which the trainer does not know before the first push
SERVING_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHOWN = 8  # tensors named per engine in a mismatch's message
HASH_THREADS = min(8, os.cpu_count() or 1)
HOST_KEPT_BYTES = 1 << 30  # host tensors a push holds for its check after the transfer; past it, digested beside it


class WeightMismatchError(RuntimeError):
    """An engine's weights differ from what the trainer pushed; `urls` names the engines that differ."""

    def __init__(self, message: str, urls: Sequence[str] = ()):
        super().__init__(message)
        self.urls = tuple(urls)

    def __reduce__(self):  # Ray carries it to the driver pickled: keep the URLs
        return type(self), (str(self), self.urls)


def mismatched_engines(exc: BaseException) -> tuple[str, ...]:
    """The URLs a WeightMismatchError names, also when it comes wrapped by Ray (its `cause`); () for other errors."""
    for candidate in (exc, getattr(exc, "cause", None), exc.__cause__):
        if isinstance(candidate, WeightMismatchError) and candidate.urls:
            return candidate.urls
    return ()


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
        self._later: list[list] = []  # host buckets' engine tensors, digested by wait()
        self._unfolded: list[tuple] = []  # (engine tensor's entry, dtype name, its block sums on its accelerator)
        self._kept_bytes = 0  # their bytes

    def watch(self, buckets: Iterable[Bucket]) -> Iterator[Bucket]:
        """The same buckets, each handed on at once. A bucket on an accelerator is digested meanwhile, on a thread of
        the ledger's (its reductions are launched beside the transfer's kernels, the next bucket is drawn once they
        were, and `wait()` folds them: the transfer never waits for them); one on the host is kept for `wait()` to digest once the transfer is done, where its
        reads would otherwise take the transfer's cores (up to HOST_KEPT_BYTES: then as an accelerator's). `wait()`
        ends the digesting."""
        self._hashing = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="push-ledger-hash")
        self._jobs = ThreadPoolExecutor(1, thread_name_prefix="push-ledger")
        try:
            for index, bucket in enumerate(buckets):
                whole = list(self._engine_tensors(bucket, index))
                later = self._keep_for_later(whole)
                pending = None if later else self._jobs.submit(self._digest, whole)
                self._later += [whole] if later else []
                self.buckets = index + 1
                yield bucket
                if pending is not None:
                    pending.result()
        finally:
            self._jobs.shutdown(wait=True)

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
        """Digest what waits and block until every bucket handed on is digested (a job's error was raised to the
        transfer, as it drew its next bucket)."""
        if self._jobs is not None:
            self._jobs.shutdown(wait=True)
        later, self._later = self._later, []
        for whole in later:
            self._digest(whole)
        unfolded, self._unfolded = self._unfolded, []
        if unfolded:
            start = time.perf_counter()
            for (entry, dtype, _), text in zip(unfolded, weight_digest.folded([sums for _, _, sums in unfolded])):
                self._record(entry, dtype, text)
            self.seconds += time.perf_counter() - start
        if self._hashing is not None:
            self._hashing.shutdown(wait=True)

    def _digest(self, whole: list[tuple[str, torch.Tensor, tuple, tuple]]) -> None:
        """Record the digests of one bucket's engine tensors, in every dtype the engines may serve in."""
        start = time.perf_counter()
        served = [(entry, dtype, t) for entry in whole for dtype, t in as_served(entry[1], self.dtypes).items()]
        if self.hashed == weight_digest.DIGEST and all(t.device.type != "cpu" for _, _, t in served):
            # the reductions are launched here and folded by wait(): no wait for the accelerator inside the transfer
            self._unfolded += [(entry, dtype, weight_digest.block_sums(t)) for entry, dtype, t in served]
        else:
            texts = digests_of([t for _, _, t in served], self.hashed, self._hashing)
            for (entry, dtype, _), text in zip(served, texts):
                self._record(entry, dtype, text)
        self.seconds += time.perf_counter() - start

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


def is_tied(source_checkpoint: str) -> bool:
    """Whether the checkpoint's config.json ties the LM head to the embedding (transformers' default: tied)."""
    try:
        config = json.loads((Path(source_checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)))


@dataclasses.dataclass
class Comparison:
    """One engine's report against the push: a line per differing tensor, how many were compared, the dtypes in which
    every floating tensor matched (None: none compared), and the engine tensors it holds in no plain form (their digest is that of no bytes: a CPU vLLM
    repacks its linear layers' weights for its kernels and leaves the parameters empty)."""

    lines: list[str] = dataclasses.field(default_factory=list)
    compared: int = 0
    matched: set[str] | None = None
    opaque: list[str] = dataclasses.field(default_factory=list)


def compare(ledger: PushLedger, held: dict[str, str], hashed: str) -> Comparison:
    """`held` ({engine tensor name: digest}) against the push."""
    out, (empty,) = Comparison(), digests_of([torch.zeros(0, dtype=torch.uint8)], hashed)
    for name, digest in sorted(held.items()):
        want = ledger.expected(name)
        if want is None:
            continue
        if digest == empty:
            out.opaque.append(name)
            continue
        out.compared += 1
        dtypes = {dtype for dtype, text in want.digests.items() if text == digest}
        if dtypes:
            if "" not in dtypes:  # a floating tensor: the dtypes the engine may serve in are those all agree on
                out.matched = dtypes if out.matched is None else out.matched & dtypes
            continue
        buckets = ", ".join(str(b) for b in sorted(set(want.buckets)))
        if name == LM_HEAD and want.sources[0] == EMBEDDING:
            out.lines.append(f"{name} (tied to {EMBEDDING}, bucket {buckets}: not the pushed embedding; not reloaded?)")
            continue
        fused = f" = {' + '.join(want.sources)}" if len(want.sources) > 1 else ""
        trainer = next(iter(want.digests.values()))
        out.lines.append(
            f"{name}{fused} (bucket {buckets} of {ledger.buckets}: engine {digest[:16]}, trainer {trainer[:16]})"
        )
    return out


def adapter_differences(ledger: PushLedger, name: str, held: dict[str, str] | None) -> list[str]:
    """A line for each adapter tensor of the push (peft's names) that the engine's adapter `name` (`held`: {tensor:
    digest}, None: not loaded) does not hold as pushed."""
    tensors = [t for t in ledger.pushed if t.startswith(PEFT_PREFIX)]
    if held is None:
        return [f"adapter {name!r} is not loaded ({len(tensors)} tensors pushed)"]
    lines = []
    for tensor in tensors:
        if held.get(tensor) not in ledger.pushed[tensor].digests.values():
            state = "another version of it" if tensor in held else "none"
            lines.append(f"{tensor} (adapter {name!r}: the engine holds {state})")
    return lines


def mismatch_message(url: str, weight_version: str, lines: list[str]) -> str:
    more = f"; and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    return (
        f"engine {url} holds other weights than the trainer pushed as version {weight_version}: "
        + "; ".join(lines[:SHOWN])
        + more
    )


class Verifier:
    """A sync's verification across pushes: it learns the engines' serving dtype from the first push's comparison,
    so later pushes hash each tensor once."""

    def __init__(self, *, source_checkpoint: str, adapter: str | None):
        self.tied = is_tied(source_checkpoint)
        self.adapter = adapter  # the LoRA adapter's name of an adapter push
        self.dtypes: tuple[torch.dtype, ...] = SERVING_DTYPES

    def served_dtype(self) -> torch.dtype | None:
        """The one floating dtype the engines serve in, once a push told it apart (None before)."""
        return self.dtypes[0] if len(self.dtypes) == 1 else None

    def ledger(self, engines: Sequence[EngineClient]) -> PushLedger:
        kind = type(engines[0]) if engines else EngineClient
        return PushLedger(
            hashed=kind.digest_hash,
            packed=kind.packed_modules,
            tied=self.tied,
            dtypes=self.dtypes,
            vocab_padding=kind.vocab_padding,
        )

    def _lines(self, engine: EngineClient, ledger: PushLedger, report: EngineDigests, found: Comparison) -> list[str]:
        """What `engine` holds otherwise than pushed: its differing tensors and adapter tensors, or that none of its
        tensors is the push's."""
        if found.opaque:
            logger.info(
                "%s: %d pushed tensors are held in a form of the engine's own, not compared (%s, ...)",
                engine.url, len(found.opaque), found.opaque[0],
            )  # fmt: skip
        lines = list(found.lines)
        if self.adapter is not None and report.adapters is not None:
            lines += adapter_differences(ledger, self.adapter, report.adapters.get(self.adapter))
        if found.compared == 0 and self.adapter is None and ledger.pushed:
            lines.append(f"none of the {len(ledger.pushed)} pushed tensors is among the engine's tensors")
        return lines

    def check(self, engines: Sequence[EngineClient], ledger: PushLedger, weight_version: str) -> list[EngineClient]:
        """Compare every engine's report (`EngineDigests`) with the push; raises WeightMismatchError naming each engine
        that differs and its tensors. Returns the engines that could not report their tensors (the caller compares
        them with each other)."""
        ledger.wait()
        failures, unreported, matched = [], [], None
        for engine in engines:
            report: EngineDigests = engine.weight_digests()
            if report.tensors is None or report.hash != ledger.hashed:
                unreported.append(engine)
                why = report.why_not or f"it reports {report.hash} digests, not {ledger.hashed}"
                logger.info("%s: verified against the other engines only: %s", engine.url, why)
                continue
            found = compare(ledger, report.tensors, report.hash)
            if found.matched is not None:
                matched = found.matched if matched is None else matched & found.matched
            lines = self._lines(engine, ledger, report, found)
            if lines:
                failures.append((engine.url, mismatch_message(engine.url, weight_version, lines)))
        if failures:
            raise WeightMismatchError("; ".join(text for _, text in failures), [url for url, _ in failures])
        served = tuple(d for d in SERVING_DTYPES if str(d) in (matched or ()))
        if served and not unreported:
            self.dtypes = served
        return unreported


def flipped(tensor: torch.Tensor, index: int = 0) -> torch.Tensor:
    """A copy of `tensor` with the bits of its byte `index` inverted."""
    copy = tensor.detach().clone().contiguous()
    copy.reshape(-1).view(torch.uint8)[index] ^= 0xFF
    return copy


def corrupted(buckets: Iterable[Bucket]) -> Iterator[Bucket]:
    """`debug.corrupt_push_version`: the buckets with one byte of the first tensor flipped (after the verification's
    digests: a transfer that changed a byte)."""
    for index, bucket in enumerate(buckets):
        if index == 0 and bucket:
            (name, tensor), rest = bucket[0], bucket[1:]
            logger.warning("debug.corrupt_push_version: one byte of %s flipped after the trainer's digests", name)
            bucket = [(name, flipped(tensor)), *rest]
        yield bucket
