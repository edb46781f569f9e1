"""Which checkpoint a run continues from: `checkpoint.resume=auto` and the pinned iteration.

Every backend writes `<root>/latest_checkpointed_iteration.txt` last, atomically, once the whole checkpoint
(data source, critic, actor) is on disk (slime/runtime/driver.py `_save`), so the tracker names the latest
complete checkpoint and anything newer under the root is the debris of a killed save.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slime.config.schema import RunConfig

TRACKER = "latest_checkpointed_iteration.txt"  # the backends' tracker file (slime/train/*/checkpoint.py)


def tracked_iteration(root: Optional[str]) -> Optional[int]:
    """The rollout id of the latest complete checkpoint under `root`; None without one (or a "release" model)."""
    if root is None:
        return None
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


def resolve_resume(cfg: RunConfig) -> None:
    """`checkpoint.resume=auto` becomes `checkpoint.load=<checkpoint.save>` when a complete checkpoint is there;
    a load without `ckpt_step` is pinned to the tracker's iteration, so every role (actor, critic, data source)
    loads the same one even if a killed save had moved a later role's tracker ahead."""
    c = cfg.checkpoint
    if c.resume == "auto" and c.load is None and tracked_iteration(c.save) is not None:
        c.load = c.save
    if c.load is not None and c.ckpt_step is None:
        c.ckpt_step = tracked_iteration(c.load)
