"""Atomic checkpoint publication, shared by the backends (slime/train/fsdp, slime/train/megatron).

A save writes everything into `<root>/.iter_0000007.partial/`, writes its manifest (every file's size and sha256:
slime/config/manifest.py, verified before a resume) and renames it to `iter_0000007/` once complete (`publish`),
then replaces the tracker file (`replace_text`). A save killed at any point leaves the
previous checkpoint the one the tracker names, with its files intact, even when the save was a re-save of
that very iteration; the debris is ignored and cleared by the next save of that id.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from slime.config.manifest import write_manifest


def staging_dir(final: Path) -> Path:
    """Where a save of `final` is written before it is published."""
    return final.with_name(f".{final.name}.partial")


def publish(staging: Path, final: Path) -> None:
    """Write the complete `staging` directory's manifest and rename it to `final`; a `final` already there (an
    untracked debris, or the tracked iteration re-saved) is moved aside first and removed once the new one is in
    place."""
    write_manifest(staging)
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old)
    else:
        staging.rename(final)


def replace_text(path: Path, text: str) -> None:
    """Write `path` atomically: a reader sees the old content or the new, never a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
