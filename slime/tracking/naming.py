"""How a run is named in the tracker (docs/tracking.md#wandb), and the run id kept with its checkpoints.

    project   logger.wandb.project
    group     logger.wandb.group, else the sweep (its directory, `<date>_<time>`), else the experiment
    name      logger.wandb.name, else the experiment plus the overrides that make this run (without seed,
              paths, hydra, logger and debug keys), e.g. `qwen3_4b_grpo:algo.eps_clip=0.1`
    tags      the chosen group options (`algo:grpo`, `model:qwen3_4b`, ...) plus logger.wandb.tags
    notes     logger.wandb.notes, else the command line and a one-line summary of the run
    id        logger.wandb.id, else the id stored with checkpoint.load (so a resumed run continues the same
              tracker run; not in a sweep, whose jobs would all append to one run), else
              `<experiment>-<10 hex of sha1(run dir)>`: the same run directory always gives the same id
The experiment is the recipe when one is chosen, else `<model>-<algo>`. Secrets are redacted from
names and notes (slime.tracking.secrets).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from slime.config.schema import RunConfig
from slime.tracking.secrets import redact_overrides

RUN_ID_FILE = "tracking_run.json"  # in the checkpoint save root, next to latest_checkpointed_iteration.txt
TAG_GROUPS = ("recipe", "model", "algo", "parallelism", "cluster", "rollout", "data", "eval")
_UNNAMED = ("seed=", "paths.", "hydra.", "logger.", "debug.", "recipe=")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HydraRun:
    """What the tracker needs from Hydra's runtime config, as plain values (tests build it directly)."""

    overrides: list[str]  # the task overrides as typed on the command line
    choices: dict[str, Any]  # group -> chosen option (hydra.runtime.choices)
    sweep_dir: str | None = None  # the multirun's sweep directory; None for a single run


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunIdentity:
    project: str
    entity: str | None
    group: str
    name: str
    tags: list[str]
    notes: str
    id: str
    job_type: str = "train"


def slug(text: str, limit: int = 48) -> str:
    """Characters wandb accepts in ids: letters, digits, `-` and `_`."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")[:limit] or "run"


def experiment_name(choices: dict[str, Any]) -> str:
    if choices.get("recipe"):
        return str(choices["recipe"])
    return f"{choices.get('model', 'model')}-{choices.get('algo', 'algo')}"


def sweep_group(sweep_dir: str) -> str:
    """`multirun/2026-11-26/17-03-00` -> `2026-11-26_17-03-00` (the sweep's date and time)."""
    parts = Path(sweep_dir).parts
    return "_".join(parts[-2:]) if len(parts) >= 2 else parts[-1]


def stored_run_id(checkpoint_root: str | None) -> str | None:
    """The tracker run id saved with a checkpoint (None when there is none)."""
    if checkpoint_root is None:
        return None
    path = Path(checkpoint_root) / RUN_ID_FILE
    return json.loads(path.read_text())["id"] if path.exists() else None


def store_run_id(checkpoint_root: str, identity: RunIdentity) -> None:
    root = Path(checkpoint_root)
    root.mkdir(parents=True, exist_ok=True)
    record = {"id": identity.id, "project": identity.project, "group": identity.group, "name": identity.name}
    (root / RUN_ID_FILE).write_text(json.dumps(record, indent=2))


def run_identity(cfg: RunConfig, hydra: HydraRun, *, summary: str = "") -> RunIdentity:
    """The tracker identity of this run; see the module docstring for each field."""
    w = cfg.logger.wandb
    experiment = experiment_name(hydra.choices)
    overrides = redact_overrides(hydra.overrides)
    naming = [o for o in overrides if not o.lstrip("+~").startswith(_UNNAMED)]
    name = w.name or (f"{experiment}:{','.join(naming)}" if naming else experiment)
    group = w.group or (sweep_group(hydra.sweep_dir) if hydra.sweep_dir else experiment)
    tags = [f"{g}:{hydra.choices[g]}" for g in TAG_GROUPS if hydra.choices.get(g)]
    notes = w.notes or "\n".join(filter(None, ["python main.py " + " ".join(overrides), summary]))
    digest = hashlib.sha1(str(Path(cfg.paths.output_dir).resolve()).encode()).hexdigest()[:10]
    resumed = None if hydra.sweep_dir else stored_run_id(cfg.checkpoint.load)
    run_id = w.id or resumed or f"{slug(experiment)}-{digest}"
    return RunIdentity(
        project=w.project,
        entity=w.entity,
        group=group[:128],
        name=name[:128],
        tags=[t[:64] for t in [*tags, *w.tags]],
        notes=notes,
        id=run_id,
    )
