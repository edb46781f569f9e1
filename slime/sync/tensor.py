"""Colocated "tensor" weight sync (REFERENCE.md §8.1): buckets handed over in memory, on the same node.

Per bucket: flatten the bucket's tensors into one fresh byte buffer (`slime.sync.wire`), a file in
/dev/shm on CPU or a CUDA buffer on GPU, then POST /update_weights_from_tensor
{serialized_named_tensors: [one per engine TP rank], load_format: "flattened_bucket"} to each engine
in turn. An engine copies into its parameters before replying; only then is the buffer freed (the
file deleted, the CUDA buffer dropped), and the next bucket gets a fresh one (reuse raced with the
engine's asynchronous copy in SGLang). The engines must run on the source rank's node.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from slime.sync import wire
from slime.sync.base import WeightSync
from slime.sync.hf_files import Bucket


class TensorWeightSync(WeightSync):
    """`rollout.weight_sync.mode=tensor`: shared-memory (CPU) or CUDA IPC (GPU) buckets, colocated engines."""

    mode = "tensor"

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        total = 0
        for bucket in buckets:
            nbytes = wire.bucket_nbytes(bucket)
            on_cuda = any(t.is_cuda for _, t in bucket)
            shm_path = None
            if on_cuda:
                buffer = torch.empty(nbytes, dtype=torch.uint8, device=next(t.device for _, t in bucket if t.is_cuda))
            else:
                buffer, shm_path = wire.new_shm_buffer(nbytes)
            try:
                metadata = wire.flatten_into(bucket, buffer)
                if on_cuda:
                    torch.cuda.current_stream(buffer.device).synchronize()  # the copy lands before the engine reads
                item = wire.encode({"handle": wire.make_handle(buffer, shm_path), "metadata": metadata})
                for engine in self.engines:
                    tp_size = int(engine.server_info().get("tp_size", 1) or 1) if on_cuda else 1
                    engine.update_weights_from_tensor([item] * tp_size, weight_version=weight_version)
            finally:
                del buffer
                if shm_path is not None:
                    os.unlink(shm_path)
            total += nbytes
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
        return total
