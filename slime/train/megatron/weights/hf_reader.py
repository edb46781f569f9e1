"""Reading single tensors of an HF safetensors checkpoint by name, without loading whole files."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

INDEX = "model.safetensors.index.json"


class HFReader:
    """Tensors of the checkpoint at `path` by HF name (through its index json, else every *.safetensors)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._open = safe_open
        self._handles: dict[str, object] = {}
        index = self.path / INDEX
        if index.exists():
            self.files = dict(json.loads(index.read_text())["weight_map"])
        else:
            self.files = {}
            for file in sorted(self.path.glob("*.safetensors")):
                with safe_open(str(file), "pt") as handle:
                    self.files.update(dict.fromkeys(handle.keys(), file.name))
        if not self.files:
            raise FileNotFoundError(f"{self.path}: no safetensors weights (no {INDEX}, no *.safetensors)")

    def names(self) -> set[str]:
        return set(self.files)

    def dtype_names(self) -> set[str]:
        """The safetensors dtypes the checkpoint holds ("F32", "BF16", ...), from the files' headers only."""
        out = set()
        for file in sorted(set(self.files.values())):
            with self._open(str(self.path / file), "pt") as handle:
                out.update(handle.get_slice(name).get_dtype() for name in handle.keys())
        return out

    def get(self, name: str) -> torch.Tensor:
        """The tensor `name` (CPU, the file's dtype); KeyError naming the checkpoint when it has none."""
        file = self.files.get(name)
        if file is None:
            raise KeyError(f"HF checkpoint {self.path} has no tensor {name!r}")
        if file not in self._handles:
            self._handles[file] = self._open(str(self.path / file), "pt")
        return self._handles[file].get_tensor(name)
