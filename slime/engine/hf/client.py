"""`BuiltinEngineClient`: the control calls of the built-in engine, SGLang's (`EngineClient`) plus the weight digests
it computes where its weights live (`/weight_digests`, slime.wire.weight_digest), which a verified sync compares
instead of SGLang's host-side sha256 checksums. Plain HTTP."""

from __future__ import annotations

from slime.engine.client import EngineClient, EngineDigests


class BuiltinEngineClient(EngineClient):
    digest_hash = "block_sums"  # slime.wire.weight_digest.DIGEST (this module imports no torch)

    def weight_digests(self, timeout: float = 600.0) -> EngineDigests:
        """POST /weight_digests: {"hash", "tensors": {name: digest}, "lora_adapters"?: {name: {tensor: digest}}}."""
        reply = self._post("/weight_digests", {}, timeout=timeout)
        return EngineDigests(hash=reply["hash"], tensors=reply["tensors"], adapters=reply.get("lora_adapters"))
