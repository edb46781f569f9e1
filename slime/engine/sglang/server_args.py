"""`rollout.sglang`: SGLang ServerArgs fields passed through to every server, checked before anything starts.

The keys are checked against SGLang's own `ServerArgs` when sglang is importable (the GPU install),
otherwise against `server_args_fields.json`, the field list of a pinned SGLang version kept in the repo
(regenerate it with `tools/gen_sglang_server_args.py`). Fields the framework sets itself (`OWNED_FIELDS`)
are rejected: each is decided by another config key or by the runtime (REFERENCE.md §7.1).

Importing this module never imports sglang; `known_fields()` tries it only when called.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Optional

from slime.engine.arg_fields import ArgIssue, FieldList, pinned_fields, type_ok

FIELDS_FILE = Path(__file__).with_name("server_args_fields.json")

# ServerArgs fields the framework sets for every server -> the config key deciding it, or why it is the framework's.
OWNED_FIELDS: dict[str, str] = {
    "model_path": "model.hf_checkpoint",
    "tokenizer_path": "model.hf_checkpoint",
    "tp_size": "cluster.rollout.num_gpus_per_engine",
    "host": "cluster.host",
    "port": "a port the framework reserves",
    "nccl_port": "a port the framework reserves",
    "dist_init_addr": "a port the framework reserves",
    "base_gpu_id": "the engine's first GPU in the placement group",
    "gpu_id_step": "the placement group",
    "nnodes": "the placement group (engines spanning nodes)",
    "node_rank": "the placement group",
    "random_seed": "seed",
    "enable_memory_saver": "cluster.colocate",
    "enable_deterministic_inference": "rollout.deterministic",
    "skip_server_warmup": "the engine's own health check",
    "enable_metrics": "the framework's monitoring",
    "device": "cluster.device",
    "weight_version": "the weight sync (each push stamps its version)",
    "disaggregation_mode": "rollout.models[*].server_groups[*].worker_type",
    "disaggregation_bootstrap_port": "a port the framework reserves",
}
_CONFIG_KEYS = ("seed",)  # OWNED_FIELDS values without a dot that are config keys


def known_fields() -> FieldList:
    """The installed sglang's ServerArgs fields when it imports, else the pinned list in FIELDS_FILE."""
    installed = _installed_fields()
    if installed is not None:
        return installed
    return pinned_fields(FIELDS_FILE, "sglang_version")


def _installed_fields() -> Optional[FieldList]:
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs
    except Exception:  # not installed, or installed without its GPU stack (no triton): use the pinned list
        return None
    if dataclasses.is_dataclass(ServerArgs):
        names = [f.name for f in dataclasses.fields(ServerArgs)]
    else:  # later 0.5.x: a msgspec struct assembled from namespaces
        import msgspec.structs

        names = [f.name for f in msgspec.structs.fields(ServerArgs)]
    return FieldList(
        version=sglang.__version__,
        source="installed sglang",
        types={name: "" for name in names if not name.startswith("_")},
    )


def check_server_args(
    args: dict[str, Any], fields: Optional[FieldList] = None, *, prefix: str = "rollout.sglang"
) -> list[ArgIssue]:
    """Every problem with `args` (ServerArgs field -> value): owned fields, unknown names, simple wrong types."""
    fields = fields or known_fields()
    issues = []
    for name, value in args.items():
        key = f"{prefix}.{name}"
        if name in OWNED_FIELDS:
            owner = OWNED_FIELDS[name]
            if "." in owner or owner in _CONFIG_KEYS:
                issues.append(
                    ArgIssue(
                        key,
                        f"the framework sets ServerArgs.{name} itself, from {owner}",
                        f"remove {key}; set {owner} instead",
                    )
                )
            else:
                issues.append(ArgIssue(key, f"the framework sets ServerArgs.{name} itself ({owner})", f"remove {key}"))
        elif name not in fields.types:
            close = difflib.get_close_matches(name, list(fields.types), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            issues.append(
                ArgIssue(
                    key,
                    f"not a ServerArgs field of sglang {fields.version} ({fields.source}){hint}",
                    "use a ServerArgs field name (python -m sglang.launch_server --help, "
                    "dashes as underscores) or remove it",
                )
            )
        elif not type_ok(fields.types[name], value):
            issues.append(
                ArgIssue(
                    key,
                    f"ServerArgs.{name} is {fields.types[name]}, got {type(value).__name__}",
                    f"set {key} to a value of type {fields.types[name]}",
                )
            )
    return issues
