"""Reads what wandb wrote offline: the records of `run-<id>.wandb` files, for tests.

wandb 0.31 has no Python reader of its transaction log any more; the format is LevelDB's log format
(32 KiB blocks; each record fragment has a 7-byte header: CRC32C (4), length (2, little endian),
type (1: full, 2: first, 3: middle, 4: last)) after a 7-byte file header (`:W&B`, magic, version).
Each record is a `wandb_internal_pb2.Record` protobuf.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7


def _payloads(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + HEADER : pos + HEADER + length], pos + HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    out = []
    for payload in _payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        out.append(record)
    return out


def read_offline_run(run_file: Path) -> dict[str, Any]:
    """{"id", "group", "name", "tags", "notes", "config": {key: value}, "history": [{key: value} per step]}."""
    run, history = None, []
    for record in records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            row = {
                "/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in record.history.item
            }
            history.append(row)
    assert run is not None, f"{run_file} has no run record"
    return {
        "id": run.run_id,
        "group": run.run_group,
        "name": run.display_name,
        "tags": list(run.tags),
        "notes": run.notes,
        "config": {u.key: json.loads(u.value_json) for u in run.config.update},
        "history": history,
    }


def offline_runs(run_dir: Path) -> list[dict[str, Any]]:
    """Every offline wandb run under `run_dir/wandb`, oldest first."""
    return [read_offline_run(f) for f in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))]
