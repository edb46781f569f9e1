"""A command run with one directory on a disk of its own, `size` bytes large: a tmpfs mounted in a private mount
namespace (`unshare --mount --map-root-user`: no other process sees it, and it is gone when the command ends). What
the command wrote there is copied to `keep` as it ends, so a test can read and resume from it."""

from __future__ import annotations

from pathlib import Path

SCRIPT = 'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 90; disk="$2"; keep="$3"; shift 3; "$@"; rc=$?; '
SCRIPT += 'cp -a "$disk"/. "$keep"/ || exit 91; exit $rc'


def on_small_disk(argv: list[str], disk: Path, size: int, keep: Path) -> list[str]:
    """`argv` with `disk` (an existing, empty directory) on a `size`-byte disk; its files end up in `keep`. Exit
    status 90: the disk could not be mounted; 91: its files could not be copied."""
    disk.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", SCRIPT, "sh", str(size), str(disk), str(keep), *argv]
