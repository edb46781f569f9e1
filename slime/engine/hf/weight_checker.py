"""`/weights_checker` of the built-in engine: SGLang 0.5.23's weight checker on this engine's one rank.

SGLang (`sglang/srt/utils/weight_checker.py:WeightChecker.handle`, answered by
`sglang/srt/entrypoints/http_server.py:check_weights`) takes `{"action", "skip_tensor_list"?}`:

    snapshot       copy every parameter and buffer
    reset_tensors  overwrite them with random values (skipping non-persistent buffers such as inv_freq)
    compare        fail, naming each tensor, unless every tensor equals the snapshot; then drop the snapshot
    checksum       per tensor `f"{tensor_hash(t):016x}"` (SGLang's CPU hash: the first 8 bytes of the sha256
                   of the tensor's bytes, big-endian), `per_gpu_checksum` over them, and the rank's placement

and answers `{"success", "message"}` (HTTP 400 when not successful) plus, for checksum, `ranks` (one
ChecksumInfo per TP rank) and `per_engine_checksum` (sha256 of the ranks' per_gpu_checksum). This engine
is one rank of tp 1; it hashes on the CPU whatever the device (SGLang on a GPU uses its own GPU hash, so
checksums compare between engines of one kind, never with another implementation), and says so in each rank's
`hash`; a rank also reports the LoRA adapter its slot holds, `lora_adapters` {name: {peft tensor name: checksum}}
(SGLang reports none).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch

from slime.engine.client import SGLANG_CPU_HASH
from slime.engine.hf.weights import StateLayout
from slime.wire.tensors import weight_checksum
from slime.wire.weight_digest import DIGEST, digests

_NON_PERSISTENT_PATTERNS = ("cos_sin_cache", "cos_cache", "sin_cache", "inv_freq", "freqs_cis", "expert_mask_gpu")


HASH_THREADS = min(8, os.cpu_count() or 1)


class WeightCheckError(ValueError):
    """A check action failed (unknown action, compare without snapshot, tensors differ)."""


tensor_checksum = weight_checksum  # SGLang's checksum text of one tensor (its CPU hash: slime.wire.tensors)


def overall_checksum(checksums: dict[str, str]) -> str:
    """`weight_checker.overall_checksum`: sha256 over the sorted names and their checksums."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def per_engine_checksum(ranks: list[dict[str, Any]]) -> str:
    """`tokenizer_control_mixin.check_weights`: sha256 over the ranks' per_gpu_checksum, in rank order."""
    h = hashlib.sha256()
    for info in ranks:
        h.update(info["per_gpu_checksum"].encode())
    return h.hexdigest()


def _skipped(name: str, skip: Optional[list[str]]) -> bool:
    return any(p in name for p in _NON_PERSISTENT_PATTERNS) or any(p in name for p in skip or ())


class WeightChecker:
    """The check actions over `model`'s parameters and buffers (tied tensors once); checksum also reports the
    adapter its LoRA slot holds (`lora`, None without one)."""

    def __init__(self, model: torch.nn.Module, lora=None, *, renamed: Optional[dict[str, str]] = None):
        self.model = model
        self.lora = lora
        self.snapshot: Optional[dict[str, torch.Tensor]] = None
        self.names = renamed or {}  # `StateLayout.renamed` of the model

    def _state(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer under the name SGLang's module holds it by: the checkpoint's, where
        transformers only files the tensor elsewhere (a vision-language model's `model.language_model.*` is
        SGLang's `model.*`, its `model.visual.*` SGLang's `visual.*`); a fused tensor (MoE experts) keeps its name."""
        state = {self.names.get(n, n): t for n, t in self.model.named_parameters()}
        state.update((self.names.get(n, n), t) for n, t in self.model.named_buffers())
        return state

    def handle(self, action: str, skip_tensor_list: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
        """Run `action`; the ChecksumInfo of this rank for "checksum", else None. Raises WeightCheckError."""
        if action == "snapshot":
            self.snapshot = {name: t.detach().clone() for name, t in self._state().items()}
        elif action == "reset_tensors":
            self._reset(skip_tensor_list)
        elif action == "compare":
            self._compare(skip_tensor_list)
        elif action == "checksum":
            return self._checksum(skip_tensor_list)
        else:
            raise WeightCheckError(f"Unsupported action={action!r}")
        return None

    @torch.no_grad()
    def _reset(self, skip: Optional[list[str]]) -> None:
        for name, tensor in self._state().items():
            if _skipped(name, skip):
                continue
            if tensor.dtype.is_floating_point:
                tensor.copy_(torch.rand(tensor.shape, dtype=torch.float32, device=tensor.device).to(tensor.dtype))
            else:
                tensor.copy_(torch.randint_like(tensor, 0, 2))

    def _compare(self, skip: Optional[list[str]]) -> None:
        if self.snapshot is None:
            raise WeightCheckError("compare needs a snapshot first (action=snapshot)")
        state = self._state()
        differ = [
            name
            for name, expected in self.snapshot.items()
            if not _skipped(name, skip) and not torch.equal(expected, state[name])
        ]
        self.snapshot = None
        if differ:
            raise WeightCheckError(
                f"check tensor equality failed: {len(differ)} tensors differ from the snapshot: {differ[:16]}"
            )

    def _checksum(self, skip: Optional[list[str]]) -> dict[str, Any]:
        state = {name: t for name, t in self._state().items() if not _skipped(name, skip)}
        with ThreadPoolExecutor(
            HASH_THREADS, thread_name_prefix="weights-checker"
        ) as pool:  # hashlib lets go of the GIL
            checksums = dict(zip(state, pool.map(tensor_checksum, state.values())))
        placement = dict(tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, pp_rank=0, pp_size=1, rank=0, size=1)
        info = {
            "checksums": checksums,
            "per_gpu_checksum": overall_checksum(checksums),
            "parallelism_info": [{"role": "target", **placement}],
            "hash": SGLANG_CPU_HASH,  # on the CPU whatever the device (the module docstring)
        }
        if self.lora is not None:  # what a verified adapter sync compares (slime.sync.verify)
            held = self.lora.held_tensors()
            info["lora_adapters"] = {self.lora.loaded: {n: tensor_checksum(t) for n, t in held.items()}} if held else {}
        return info


def digests_reply(checker: WeightChecker, layout: StateLayout) -> dict[str, Any]:
    """`/weight_digests` of this engine (not an SGLang route): each checkpoint tensor it holds, by checkpoint name
    (`layout`: a MoE layer's experts one by one where transformers fuses them; a head held apart, not a tied one), and
    the tensors of the adapter its LoRA slot holds, as `slime.wire.weight_digest` digests (computed where the weights
    live)."""
    names = sorted(set(layout.slots) - layout.aliases)  # a tied head is the embedding itself here
    reply: dict[str, Any] = {"hash": DIGEST, "tensors": dict(zip(names, digests([layout.tensor(n) for n in names])))}
    if checker.lora is not None:
        held = checker.lora.held_tensors()
        reply["lora_adapters"] = {checker.lora.loaded: dict(zip(held, digests(list(held.values()))))} if held else {}
    return reply


def checker_reply(checker: WeightChecker, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(the JSON body, the HTTP status) SGLang's `/weights_checker` answers `body` with."""
    try:
        info = checker.handle(str(body.get("action", "checksum")), body.get("skip_tensor_list"))
    except WeightCheckError as exc:
        return {"success": False, "message": str(exc)}, 400
    reply: dict[str, Any] = {"success": True, "message": "Success."}
    if info is not None:
        reply["ranks"] = [info]
        reply["per_engine_checksum"] = per_engine_checksum([info])
    return reply, 200
