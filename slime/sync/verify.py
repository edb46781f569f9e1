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
What the push carried, and how the trainer digests it, is slime.sync.push_ledger's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from slime.engine.client import EngineClient, EngineDigests
from slime.sync.push_ledger import EMBEDDING, LM_HEAD, SERVING_DTYPES, PushLedger, digests_of
from slime.wire.tensors import Bucket

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."  # peft's saved names: every adapter tensor's, never a base weight's
SHOWN = 8  # tensors named per engine in a mismatch's message


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
