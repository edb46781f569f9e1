"""Atomic checkpoint publication, shared by the backends (slime/train/fsdp, slime/train/megatron).

A save writes everything into `<root>/.iter_0000007.partial/`, writes its manifest (every file's size and sha256:
slime/config/manifest.py, verified before a resume) and renames it to `iter_0000007/` once complete (`publish`),
then replaces the tracker file (`replace_text`). A save killed at any point leaves the
previous checkpoint the one the tracker names, with its files intact, even when the save was a re-save of
that very iteration; the debris is ignored and cleared by the next save of that id. The rollout side's state files
(`save_state_files`) are each written whole and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from slime.config.manifest import write_manifest
from slime.config.resume import iteration_dir, tracked_iteration

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_MIB = 1 << 20


class CheckpointDiskFull(OSError):
    """A save that ran out of disk: its staged files are removed and the previous checkpoint stays the tracked one."""


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


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _disk_full(exc: BaseException, root: Path, still_needed: int) -> bool:
    """A write error with the disk's errno, or torch's writer failing (its RuntimeError names no errno) on a disk
    with less free space than the save still needed."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    return isinstance(exc, RuntimeError) and shutil.disk_usage(root).free < max(still_needed, _MIB)


@contextlib.contextmanager
def disk_checked(root: Path, final: Path) -> Iterator[None]:
    """The writing of `final`'s staged files: a full disk removes them and raises CheckpointDiskFull naming the
    path, the free space and what the checkpoint needs (the size of the previous iteration, or what was staged)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        previous = tracked_iteration(str(root))
        previous_bytes = _bytes_under(iteration_dir(root, previous)) if previous is not None else 0
        staged = staging_dir(final)
        written = _bytes_under(staged)
        if not _disk_full(exc, root, previous_bytes - written):
            raise
        shutil.rmtree(staged, ignore_errors=True)
        free = shutil.disk_usage(root).free
        need = max(previous_bytes, written)
        kept = f"iteration {previous} stays the newest checkpoint" if previous is not None else "no checkpoint saved"
        raise CheckpointDiskFull(
            errno.ENOSPC,
            f"checkpoint save to {final}: the disk is full ({free / _MIB:,.0f} MiB free at {root}); a checkpoint "
            f"needs about {need / _MIB:,.0f} MiB{' or more' if need == written else ''} there. Free space or set "
            f"checkpoint.save to a larger disk; {kept} ({exc})",
        ) from exc


def save_state_files(root: Path, rollout_id: int, states: dict[str, Any]) -> None:
    """Each state as `<root>/rollout/<name>`, written to `<name>.partial` and renamed once complete (a killed save
    leaves no such file); a full disk removes the partial file and raises CheckpointDiskFull naming the save, the
    free space and what a checkpoint needs (slime.train.checkpoint_files.disk_checked)."""
    directory = root / "rollout"
    for name, state in states.items():
        partial = directory / f"{name}.partial"
        with disk_checked(root, iteration_dir(root, rollout_id)):
            try:
                torch.save(state, partial)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        partial.replace(directory / name)
