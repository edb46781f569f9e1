"""Rollout dumps: each rollout step's trained samples as JSONL, and training from them without engines.

`debug.save_rollout_data=true` writes `<run dir>/rollout_data/<rollout_id>.jsonl`, one `Sample.to_dict()`
per line in training order: identity (`index`, `group_index`, `prompt_index`, `epoch`), `prompt`,
`label`, `metadata`, `status`, `response_length`, `reward`, `error`, and what training needs again
(`tokens`, `loss_mask`, `rollout_log_probs`, `remove_sample`). `debug.load_rollout_data=<dir>` replays
those files: the rollout manager starts no router and no engine, and weights are not pushed anywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from slime.types import Sample

DUMP_DIR = "rollout_data"


def dump_path(directory: str | Path, rollout_id: int) -> Path:
    return Path(directory) / f"{rollout_id}.jsonl"


def save_rollout_data(run_dir: str | Path, rollout_id: int, groups: list[list[Sample]]) -> Path:
    """Write the step's groups to `<run_dir>/rollout_data/<rollout_id>.jsonl`; returns the file."""
    path = dump_path(Path(run_dir) / DUMP_DIR, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for group in groups:
            for sample in group:
                f.write(json.dumps(sample.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(path)  # a crash mid-write never leaves a truncated dump behind
    return path


def load_rollout_data(directory: str | Path, rollout_id: int) -> list[list[Sample]]:
    """The groups of one dump, in file order; ValueError naming file:line for a bad record."""
    path = dump_path(directory, rollout_id)
    groups: dict[int, list[Sample]] = {}
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                sample = Sample.from_dict(json.loads(line))
                sample.check_alignment()
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"{path}:{line_no}: not a dumped sample ({type(exc).__name__}: {exc})") from None
            if sample.reward is None:
                raise ValueError(f"{path}:{line_no}: sample {sample.index} has no reward")
            groups.setdefault(sample.group_index, []).append(sample)
    if not groups:
        raise ValueError(f"{path}: no samples")
    return list(groups.values())


def epoch_coverage(directory: str | Path) -> dict[int, dict[int, int]]:
    """{epoch: {prompt_index: times trained}} over every dump in `directory`, one count per group.

    "Every prompt trained exactly once per epoch" holds when each completed epoch maps every prompt
    index of the dataset to 1 (the last epoch of a run may be partial).
    """
    coverage: dict[int, dict[int, int]] = {}
    for path in sorted(Path(directory).glob("*.jsonl"), key=lambda p: int(p.stem)):
        for group in load_rollout_data(directory, int(path.stem)):
            counts = coverage.setdefault(group[0].epoch, {})
            counts[group[0].prompt_index] = counts.get(group[0].prompt_index, 0) + 1
    return coverage


def buffered_prompts(state_file: str | Path) -> dict[int, set[int]]:
    """{epoch: prompt indices} of the groups waiting in a saved data-source buffer (a checkpoint's
    `rollout/global_dataset_state_dict_<id>.pt`): drawn, not yet trained, and not lost."""
    state = torch.load(state_file, weights_only=True)
    pending: dict[int, set[int]] = {}
    for group in state.get("buffer", []):
        pending.setdefault(group[0]["epoch"], set()).add(group[0]["prompt_index"])
    return pending


def main(argv: list[str] | None = None) -> int:
    """`python -m slime.rollout.dumps <rollout_data dir> <num prompts> [<data-source state .pt>]`: per epoch,
    prompts trained, repeated, waiting in the buffer (with the run's last data-source state) and missing.
    Exit 1 when a prompt was trained twice in an epoch, or is missing from an epoch before the last."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m slime.rollout.dumps <rollout_data dir> <number of prompts> [<state .pt>]")
        return 2
    num_prompts, ok = int(args[1]), True
    pending = buffered_prompts(args[2]) if len(args) == 3 else {}
    coverage = epoch_coverage(args[0])
    for epoch, counts in sorted(coverage.items()):
        repeated = sorted(i for i, c in counts.items() if c > 1)
        waiting = pending.get(epoch, set())
        missing = sorted(set(range(num_prompts)) - set(counts) - waiting)
        ok = ok and not repeated and not (waiting & set(counts)) and not (missing and epoch < max(coverage))
        print(
            f"epoch {epoch}: {len(counts)} of {num_prompts} prompts trained, repeated {repeated[:10]}, "
            f"in the buffer {len(waiting)}, missing {len(missing)} {missing[:10]}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
