"""The prompt file a checkpoint's data-source cursor belongs to: its spec and sha256, saved beside the data source's
state (`<root>/rollout/prompt_data.json`), and checked before a resume. A cursor resumed over another file would
draw other prompts (or skip some) without a word; so a changed file is exit 2 naming it, unless
`checkpoint.allow_data_change=true`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from slime.config.manifest import sha256_of
from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.rollout.prompt_file import DataFileError, split_slice

RECORD = "prompt_data.json"


def prompt_identity(spec: Optional[str]) -> Optional[dict[str, Any]]:
    """{"prompt_data": spec, "sha256": the file's} for a prompt file spec (`file` or `file@[a:b]`); None when there
    is no such local file (no prompt data, or a dataset a custom data source reads its own way)."""
    if not spec:
        return None
    try:
        path = Path(split_slice(spec)[0])
    except DataFileError:  # a malformed slice: validation's data check reports it
        return None
    return {"prompt_data": spec, "sha256": sha256_of(path)} if path.is_file() else None


def write_identity(directory: Path, identity: dict[str, Any]) -> None:
    """`directory/prompt_data.json`, replaced atomically."""
    tmp = directory / f"{RECORD}.partial"
    tmp.write_text(json.dumps(identity, indent=1))
    tmp.replace(directory / RECORD)


def resume_root(cfg: RunConfig) -> Optional[Path]:
    """The checkpoint root a run resumes from, before resolve_resume pins it: checkpoint.load, or under
    resume=auto checkpoint.save (default <run dir>/checkpoints)."""
    c = cfg.checkpoint
    if c.load is not None:
        return Path(c.load)
    if c.resume == "auto":
        return Path(c.save if c.save is not None else f"{cfg.paths.output_dir}/checkpoints")
    return None


def check_data_unchanged(cfg: RunConfig) -> Iterator[Problem]:
    """data.prompt_data is the file (and row slice) the resumed checkpoint's cursor was saved over."""
    root = resume_root(cfg)
    record = root / "rollout" / RECORD if root is not None else None
    if record is None or not record.is_file() or cfg.checkpoint.allow_data_change:
        return
    saved = json.loads(record.read_text())
    now = prompt_identity(cfg.data.prompt_data)
    if now == saved:
        return
    if now is None or now["prompt_data"] != saved["prompt_data"]:
        what = f"the checkpoint's data source read {saved['prompt_data']!r}"
    else:
        what = f"{split_slice(saved['prompt_data'])[0]} changed since the checkpoint was saved (sha256 {saved['sha256'][:12]}... then, {now['sha256'][:12]}... now)"
    yield Problem(
        "data.prompt_data",
        cfg.data.prompt_data,
        f"resuming from {root}: {what}, so its saved cursor would draw other prompts",
        "restore that file, or set checkpoint.allow_data_change=true to continue the cursor over this one",
    )
