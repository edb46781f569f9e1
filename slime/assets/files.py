"""Writing generated assets safely when several runs start at once (a sweep's jobs on one machine).

`creation_lock(path)` serialises the creators of one asset: each checks, under the lock, whether the asset is
already there before making it, so it is made once and never replaced under a run that reads it. Files are
written to a temporary sibling and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def creation_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` (created beside `path`) for the duration of the block."""
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the handle closes
        yield


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write one JSON object per line to `path` through a temporary sibling and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
    tmp.replace(path)
    return path
