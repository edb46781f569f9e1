"""Append-only JSONL writer: one object per line, flushed per event so a crash loses nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


class JsonlWriter:
    """Appends one JSON object per line to `path` and flushes each, so a crash loses nothing written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: str | Path, *, tolerant: bool = False) -> list[dict[str, Any]]:
    """Every record; `tolerant` skips lines that do not parse (a run killed mid-line leaves one at the end)."""
    records = []
    with Path(path).open() as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if not tolerant:
                    raise
    return records
