"""Continuous metrics across a crash and resume: every step in metrics.jsonl once, none missing (and
each rollout's sample previews in samples.jsonl at most once).

A rollout's records (its K `train/step` records, then its `rollout/step` record) are logged after its
checkpoint is saved, so a run killed in between has a checkpoint of rollout k and no records of it.
Before each save the driver stages those records with the checkpoint (`stage`,
`<checkpoint root>/tracking/records_<k>.json`, written atomically); a resume from checkpoint k then
(`reconcile`) drops from metrics.jsonl every record of a rollout after k (logged past the last checkpoint,
rolled back with it; a partial last line of a killed write as well) and logs the staged records of k when
the log lacks them. The staged copy holds what was known before the save: the record of rollout k as
written then lacks its save and weight-sync timings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slime.config.resume import iteration_dir, tracked_iteration
from slime.tracking.jsonl import read_jsonl
from slime.train.checkpoint_files import disk_checked

STAGED_DIR = "tracking"  # under the checkpoint root


def owner(record: dict[str, Any], steps_per_rollout: int) -> int:
    """The rollout a record belongs to: its rollout/step; train/step s: s // K; eval/step e (the eval after
    rollout e - 1): e - 1 (-1: before training)."""
    if "rollout/step" in record:
        return int(record["rollout/step"])
    if "train/step" in record:
        return int(record["train/step"]) // max(steps_per_rollout, 1)
    return int(record.get("eval/step", 0)) - 1


def staged_path(root: str | Path, rollout_id: int) -> Path:
    return Path(root) / STAGED_DIR / f"records_{rollout_id}.json"


def stage(root: str | Path, rollout_id: int, records: list[dict[str, Any]], *, run_dir: Path) -> None:
    """Keep rollout `rollout_id`'s records with its checkpoint (before the checkpoint is saved); older staged
    files than the latest complete checkpoint's are removed."""
    path = staged_path(root, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with disk_checked(Path(root), iteration_dir(Path(root), rollout_id)):  # a full disk named as the save's
        try:
            tmp.write_text(json.dumps({"run_dir": str(run_dir), "records": records}, default=str))
        except BaseException:  # nothing half-written is left beside the checkpoint
            tmp.unlink(missing_ok=True)
            raise
    tmp.replace(path)
    last = tracked_iteration(str(root))
    for old in path.parent.glob("records_*.json"):
        if last is not None and int(old.stem.rpartition("_")[2]) < last:
            old.unlink(missing_ok=True)


def reconcile(metrics_path: Path, root: str | Path, start: int, steps_per_rollout: int) -> list[dict[str, Any]]:
    """Rewrite `metrics_path` for a run resumed at rollout `start` from the checkpoint under `root`:
    records of rollouts before `start` only, rollout start-1's whole or not at all. Returns the staged
    records of rollout start-1 to log when the file lacks them (none when the checkpoint is another run's)."""
    records = read_jsonl(metrics_path, tolerant=True) if metrics_path.exists() else []
    last = start - 1
    complete = any(r.get("rollout/step") == last and "train/step" not in r for r in records)
    kept = [
        r for r in records if owner(r, steps_per_rollout) < last or (complete and owner(r, steps_per_rollout) == last)
    ]
    _rewrite(metrics_path, kept)
    staged = staged_path(root, last)
    if complete or not staged.exists():
        return []
    saved = json.loads(staged.read_text())
    return saved["records"] if saved["run_dir"] == str(metrics_path.parent) else []


def cut_samples(samples_path: Path, start: int) -> None:
    """samples.jsonl of a run resumed at rollout `start`: the previews of rollouts from `start` on are
    dropped (those rollouts run again and log their own), a torn last line as well."""
    if samples_path.exists():
        records = read_jsonl(samples_path, tolerant=True)
        _rewrite(samples_path, [r for r in records if r.get("rollout_step", -1) < start])


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the JSONL file at `path` by `records`, atomically (a crash leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        out.writelines(json.dumps(r) + "\n" for r in records)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def has_eval(metrics_path: Path, eval_step: int) -> bool:
    """Whether metrics.jsonl holds the eval record of `eval_step`."""
    return metrics_path.exists() and any(
        r.get("eval/step") == eval_step for r in read_jsonl(metrics_path, tolerant=True)
    )
