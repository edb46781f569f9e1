"""Which checkpoint a run continues from: `checkpoint.resume=auto` and the pinned iteration.

Every backend publishes an iteration whole (staged, its manifest of file sizes and checksums written, renamed:
slime/train/checkpoint_files.py) and writes `<root>/latest_checkpointed_iteration.txt` last, atomically, once the
whole checkpoint (data source, critic, actor) is on disk (slime/driver/loop.py `save`), so the tracker names the
latest complete checkpoint and anything newer under the root is the debris of a killed save.

Before a run resumes, the iteration it picks is verified against its manifest: `resume=auto` (and a
`checkpoint.load` without `ckpt_step`) falls back to the newest whole iteration and says so; an explicit
`ckpt_step` whose iteration is torn, or a root with no whole iteration left, is a ConfigError (exit 2) naming the
file. An empty or unreadable tracker is never read as "no checkpoint" (that would train from scratch over the
saved ones): the newest whole iteration is used, and said.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Optional

from slime.config.manifest import torn_file
from slime.config.problems import ConfigError, Problem
from slime.config.schema import RunConfig

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"  # the backends' tracker file (slime/train/*/checkpoint.py)
RELEASE = "release"  # a Megatron release model's tracker: weights only, no iteration
_ITER = re.compile(r"iter_(\d{7})")


class TrackerError(ValueError):
    """A tracker file that exists but names no iteration (empty, garbled or unreadable)."""


def iteration_dir(root: Path, step: int) -> Path:
    return root / f"iter_{step:07d}"


def read_tracker(root: Path) -> Optional[int]:
    """The rollout id the tracker under `root` names; None without a tracker or for a release model. Raises
    TrackerError when the file is there but names no iteration."""
    tracker = root / TRACKER
    if not tracker.is_file():
        return None
    try:
        text = tracker.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrackerError(f"{tracker} is unreadable ({exc})") from None
    if text == RELEASE:
        return None
    if not text.isdigit():
        raise TrackerError(f"{tracker} is empty" if not text else f"{tracker} holds {text[:40]!r}, not a rollout id")
    return int(text)


def tracked_iteration(root: Optional[str]) -> Optional[int]:
    """The rollout id of the latest complete checkpoint under `root`; None without one (a release model, or a
    tracker naming none: resolve_resume decides what a run does with such a root, this only reads it)."""
    if root is None:
        return None
    try:
        return read_tracker(Path(root))
    except TrackerError:
        return None


def torn_problem(root: Path, step: int) -> Optional[str]:
    """None when iteration `step` under `root` is whole for every role saved there: the actor's iteration (and a
    critic's under `root/critic`) match their manifests, and the data source's state of that rollout is there."""
    directory = iteration_dir(root, step)
    if not directory.is_dir():
        return f"{directory} is missing"
    critic = iteration_dir(root / "critic", step)
    for part in (directory, critic) if critic.is_dir() else (directory,):
        problem = torn_file(part)
        if problem is not None:
            return problem
    data_state = root / "rollout" / f"global_dataset_state_dict_{step}.pt"
    if (root / "rollout").is_dir() and not data_state.is_file():
        return f"{data_state} is missing"
    return None


def _saved_iterations(root: Path) -> list[int]:
    """The published iterations under `root`, newest first."""
    found = (_ITER.fullmatch(p.name) for p in root.iterdir()) if root.is_dir() else ()
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def newest_whole(root: Path, key: str) -> Optional[int]:
    """The iteration a resume from `root` continues from: the tracker's if whole, else the newest whole one before
    it (every one, when the tracker names none), each fallback logged; None when `root` holds no checkpoint.
    ConfigError (naming `key`) when checkpoints are there and none is whole."""
    try:
        tracked, ceiling = read_tracker(root), None
    except TrackerError as exc:
        tracked, ceiling = None, str(exc)
        if not _saved_iterations(root):
            raise ConfigError([Problem(key, str(root), str(exc), f"remove {root / TRACKER} to start afresh")]) from None
    if tracked is None and ceiling is None:
        return None
    torn = []
    for step in _saved_iterations(root):
        if tracked is not None and step > tracked:
            continue  # debris of a save killed before the tracker moved
        problem = torn_problem(root, step)
        if problem is None:
            if torn or ceiling:
                why = ceiling or f"iteration {tracked} is torn: {torn[0]}"
                logger.warning(
                    "checkpoint under %s: %s; resuming from iteration %d, the newest whole one", root, why, step
                )
            return step
        torn.append(problem)
    first = torn[0] if torn else f"{iteration_dir(root, tracked or 0)} is missing"
    raise ConfigError(
        [
            Problem(
                key,
                str(root),
                f"no whole checkpoint under it ({ceiling or first})",
                "restore the files, or set checkpoint.resume=null and another checkpoint.save to start afresh",
            )
        ]
    )


def resolve_resume(cfg: RunConfig) -> None:
    """`checkpoint.resume=auto` becomes `checkpoint.load=<checkpoint.save>` pinned to its newest whole iteration
    when the root holds a checkpoint; a load without `ckpt_step` is pinned the same way, so every role (actor,
    critic, data source) loads the same one even if a killed save had moved a later role's tracker ahead; an
    explicit `ckpt_step` must be whole (ConfigError naming the file)."""
    c = cfg.checkpoint
    if c.resume == "auto" and c.load is None and c.save is not None:
        step = newest_whole(Path(c.save), "checkpoint.save")
        if step is not None:
            c.load, c.ckpt_step = c.save, step
        return
    if c.load is None:
        return
    if c.ckpt_step is None:
        c.ckpt_step = newest_whole(Path(c.load), "checkpoint.load")
        return
    problem = torn_problem(Path(c.load), c.ckpt_step)
    if problem is not None:
        raise ConfigError(
            [
                Problem(
                    "checkpoint.ckpt_step",
                    c.ckpt_step,
                    f"iteration {c.ckpt_step} under {c.load} is torn: {problem}",
                    "pick a whole iteration, or drop checkpoint.ckpt_step to resume from the newest whole one",
                )
            ]
        )
