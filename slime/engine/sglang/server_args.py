"""`rollout.sglang`: SGLang ServerArgs fields passed through to every server, checked before anything starts and
rendered as SGLang's own command line.

`server_args_fields.json` records, for every ServerArgs field of the pinned SGLang version, the argparse action
SGLang's own parser registers for it (`ServerArgs.add_cli_args`; regenerate with `tools/gen_sglang_server_args.py`).
`server_args_cli` renders values from those recorded actions, never from type annotations: the registered flag
name, `--x` / `--no-x` for BooleanOptionalAction, one JSON word for fields whose argparse type parses JSON.
`check_server_args` refuses what that command line cannot carry: fields without a flag, values outside the
recorded choices or of the wrong type, values a flag cannot express. Fields the framework sets itself
(`OWNED_FIELDS`) are refused too: each is decided by another config key or by the runtime
(docs/architecture.md#launching-an-sglang-server).

Importing this module never imports sglang.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Optional

from slime.engine.arg_fields import ArgIssue, FieldList

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
    "enable_return_routed_experts": "algo.routing_replay",
    "disaggregation_mode": "rollout.models[*].server_groups[*].worker_type",
    "disaggregation_bootstrap_port": "a port the framework reserves",
}
_CONFIG_KEYS = ("seed",)  # OWNED_FIELDS values without a dot that are config keys
_LISTS = ("+", "*")  # nargs of a flag followed by each value
_SIMPLE: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerArgsFields(FieldList):
    """The field list plus, per field, the recorded argparse action (keys: tools/gen_sglang_server_args.py), or
    None when SGLang registers no flag for it."""

    actions: dict[str, Optional[dict[str, Any]]]


def known_fields() -> ServerArgsFields:
    """The ServerArgs fields and command-line actions of the pinned SGLang version (FIELDS_FILE)."""
    data = json.loads(FIELDS_FILE.read_text())
    return ServerArgsFields(
        version=data["sglang_version"],
        source=f"pinned list {FIELDS_FILE.name}",
        types={name: spec["type"] for name, spec in data["fields"].items()},
        actions={name: spec["cli"] for name, spec in data["fields"].items()},
    )


def installed_version_issue(prefix: str = "rollout.sglang") -> Optional[ArgIssue]:
    """A problem when an installed sglang is not the version whose parser FIELDS_FILE records (read from the
    package metadata: sglang is not imported)."""
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    recorded = json.loads(FIELDS_FILE.read_text())["sglang_version"]
    if installed == recorded:
        return None
    return ArgIssue(
        prefix,
        f"the installed sglang is {installed}, but server command lines are rendered from sglang {recorded}'s "
        f"recorded parser ({FIELDS_FILE.name})",
        f"pip install sglang=={recorded}, or record the installed parser: python tools/gen_sglang_server_args.py",
    )


def check_server_args(
    args: dict[str, Any], fields: Optional[ServerArgsFields] = None, *, prefix: str = "rollout.sglang"
) -> list[ArgIssue]:
    """Every problem with `args` (ServerArgs field -> value): owned fields, unknown names, fields without a flag,
    values SGLang's parser would refuse or read differently."""
    fields = fields or known_fields()
    issues = []
    for name, value in args.items():
        key = f"{prefix}.{name}"
        if name in OWNED_FIELDS:
            issues.append(_owned_issue(key, name))
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
        else:
            issue = value_issue(key, name, value, fields)
            if issue is not None:
                issues.append(issue)
    return issues


def server_args_cli(args: dict[str, Any], fields: Optional[ServerArgsFields] = None) -> list[str]:
    """The command-line words that give SGLang's parser exactly `args` (field -> value; None: left out).

    ValueError when a recorded field's value cannot be carried (validation reports the same, with the key
    that holds it). A name the record does not know goes as `--name value` for the server to refuse:
    validation stops it first; a caller that skips validation gets the server's own error and log.
    """
    fields = fields or known_fields()
    words: list[str] = []
    for name, value in args.items():
        if name not in fields.actions:
            words += ["--" + name.replace("_", "-"), _word(value)]
            continue
        issue = value_issue(name, name, value, fields)
        if issue is not None:
            raise ValueError(issue.message)
        words += _render(value, fields.actions[name])
    return words


def _render(value: Any, action: dict[str, Any]) -> list[str]:
    flag = action["flag"]
    if value is None:
        return []
    if action["action"] == "boolean_optional":
        return [flag if value else action["no_flag"]]
    if action["nargs"] == 0:  # store_true / store_false / store_const and custom flags: the flag stores const
        return [flag] if value == action["const"] else []
    if action["nargs"] in _LISTS:
        return [flag, *map(_word, value)]
    return [flag, _word(value)]


def _word(value: Any) -> str:
    """One command-line word: JSON objects and lists as JSON text (what json-parsing argparse types read)."""
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) else str(value)


def _owned_issue(key: str, name: str) -> ArgIssue:
    owner = OWNED_FIELDS[name]
    if "." in owner or owner in _CONFIG_KEYS:
        return ArgIssue(
            key, f"the framework sets ServerArgs.{name} itself, from {owner}", f"remove {key}; set {owner} instead"
        )
    return ArgIssue(key, f"the framework sets ServerArgs.{name} itself ({owner})", f"remove {key}")


def value_issue(key: str, name: str, value: Any, fields: ServerArgsFields) -> Optional[ArgIssue]:
    """Why SGLang's parser cannot be given `value` for field `name` (its recorded action), or None."""
    action = fields.actions[name]
    if action is None:
        return ArgIssue(
            key,
            f"SGLang {fields.version} has no command-line flag for ServerArgs.{name}: it cannot be set at launch",
            f"remove {key}",
        )
    flag, default = action["flag"], action["default"]
    if value is None:
        if default is None:
            return None
        return ArgIssue(
            key,
            f"None cannot be given on SGLang's command line: without {flag} ServerArgs.{name} is {default!r}",
            f"remove {key} to keep SGLang's default, or give it a value",
        )
    if action["action"] == "boolean_optional" or action["nargs"] == 0:
        return _flag_issue(key, name, value, action)
    if action["nargs"] in _LISTS:
        return _list_issue(key, name, value, action)
    return _single_issue(key, name, value, action)


def _flag_issue(key: str, name: str, value: Any, action: dict[str, Any]) -> Optional[ArgIssue]:
    """A flag without a value stores its const; left out, the field keeps the parser's default."""
    flag, const, default = action["flag"], action["const"], action["default"]
    if action["action"] == "boolean_optional":
        if isinstance(value, bool):
            return None
        return ArgIssue(
            key,
            f"ServerArgs.{name} is a flag ({flag} / {action['no_flag']}), got {type(value).__name__}",
            f"set {key} to true or false",
        )
    if isinstance(const, bool) and not isinstance(value, bool):
        return ArgIssue(key, f"ServerArgs.{name} is a flag ({flag}), got {type(value).__name__}", f"set {key} to true")
    if value == const or value == default:
        return None
    return ArgIssue(
        key,
        f"SGLang's {flag} can only set ServerArgs.{name} to {json.dumps(const)}, and without it the field is "
        f"{json.dumps(default)}: {json.dumps(value)} cannot be expressed on its command line",
        f"remove {key} or set it to {json.dumps(const)}",
    )


def _list_issue(key: str, name: str, value: Any, action: dict[str, Any]) -> Optional[ArgIssue]:
    flag = action["flag"]
    if not isinstance(value, (list, tuple)):
        return ArgIssue(
            key,
            f"ServerArgs.{name} takes a list ({flag} V1 V2 ...), got {type(value).__name__}",
            f"set {key} to a list, e.g. [{json.dumps(value)}]",
        )
    if not value and action["nargs"] == "+":
        return ArgIssue(key, f"{flag} takes at least one value", f"give {key} a value or remove it")
    if action["action"] == "custom":  # the action reads the words itself (LoRAPathAction: paths or JSON objects)
        return None
    for element in value:
        issue = _scalar_issue(key, name, element, action)
        if issue is not None:
            return issue
    return None


def _single_issue(key: str, name: str, value: Any, action: dict[str, Any]) -> Optional[ArgIssue]:
    flag = action["flag"]
    if action["value_type"] == "json":
        if isinstance(value, (dict, list, tuple)) or (isinstance(value, str) and _is_json(value)):
            return None
        return ArgIssue(
            key,
            f"{flag} takes one JSON value (argparse type {action['type']}), got {value!r}",
            f"set {key} to a mapping or list (passed as one JSON word), or to JSON text",
        )
    if isinstance(value, (dict, list, tuple)):
        return ArgIssue(
            key,
            f"ServerArgs.{name} takes one value ({flag} V), got a {type(value).__name__}",
            f"set {key} to a single value",
        )
    return _scalar_issue(key, name, value, action)


def _scalar_issue(key: str, name: str, value: Any, action: dict[str, Any]) -> Optional[ArgIssue]:
    """One value against the recorded argparse type's result and the recorded choices."""
    flag, choices, value_type = action["flag"], action["choices"], action["value_type"]
    allowed = _SIMPLE.get(value_type or "")
    if allowed is not None and (isinstance(value, bool) or not isinstance(value, allowed)):
        return ArgIssue(
            key,
            f"ServerArgs.{name} is {value_type} ({flag}, argparse type {action['type']}), got {type(value).__name__}",
            f"set {key} to a value of type {value_type}",
        )
    if choices is not None and value not in choices:
        return ArgIssue(
            key,
            f"{value!r} is not one of SGLang's choices for {flag}: {', '.join(map(str, choices))}",
            f"set {key} to one of them",
        )
    return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
