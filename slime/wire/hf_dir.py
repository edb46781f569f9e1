"""Writing an HF checkpoint directory from buckets of HF-named tensors (disk sync, `checkpoint.save_hf`).

    <dir>/model-00001.safetensors ...            one file per bucket, written as it arrives
    <dir>/model.safetensors.index.json           tensor name -> file
    <dir>/config.json, tokenizer files           copied from the source HF checkpoint

A bucket is a list of (HF name, tensor); tensors are written contiguous, on CPU, in their dtype.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from safetensors.torch import save_file

from slime.wire.tensors import Bucket

# Files of an HF checkpoint besides the weights that a server needs to load it.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def copy_side_files(src: str | Path, dst: str | Path) -> None:
    """Copy config and tokenizer files that exist in `src` and not yet in `dst`."""
    src, dst = Path(src), Path(dst)
    for name in HF_SIDE_FILES:
        if (src / name).exists() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


def write_hf_dir(buckets: Iterable[Bucket], path: str | Path, *, source_checkpoint: str | Path) -> int:
    """Write every bucket as one safetensors file plus the index and side files; returns bytes written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    total, weight_map = 0, {}
    for i, bucket in enumerate(buckets):  # written as they come: at most one bucket in host memory
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in bucket}
        file_name = f"model-{i + 1:05d}.safetensors"
        save_file(tensors, str(path / file_name), metadata={"format": "pt"})
        for key, tensor in tensors.items():
            weight_map[key] = file_name
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    copy_side_files(source_checkpoint, path)
    return total
