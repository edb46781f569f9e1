"""Validation of the weight-sync modes: the checks of their registry records (slime.registry.WEIGHT_SYNC),
run by slime/plan/validate.py before anything starts. No torch at import."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem, get
from slime.config.schema import RunConfig
from slime.registry import ENGINES, WEIGHT_SYNC


def check_disk_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """`keep` is disk mode's option: only disk mode writes weight directories."""
    ws = cfg.rollout.weight_sync
    if ws.keep:
        yield Problem(
            "rollout.weight_sync.keep",
            True,
            f"only disk mode writes weight directories to keep; mode={ws.mode!r}",
            "set rollout.weight_sync.keep=false or rollout.weight_sync.mode=disk",
        )


def check_tensor(cfg: RunConfig) -> Iterator[Problem]:
    """Tensor mode needs the engines on the trainer's devices. Colocated, on any number of nodes: every engine TP rank
    opens the handle that the training rank on its own device staged (slime.sync.tensor), so no handle leaves its
    node; only the request carrying them does."""
    if not cfg.cluster.colocate:
        yield Problem(
            "rollout.weight_sync.mode",
            "tensor",
            "tensor mode hands weights over in shared memory / CUDA IPC, "
            "so the engines must share the trainer's node and devices (cluster.colocate=false)",
            "set cluster.colocate=true, or rollout.weight_sync.mode=distributed (or disk)",
        )


def check_distributed(cfg: RunConfig) -> Iterator[Problem]:
    """Distributed mode's NCCL group holds the trainer's source rank and every engine TP rank. Colocated on GPUs, a
    training rank and an engine rank share a GPU, and NCCL refuses two ranks of one group on one device ("Duplicate
    GPU detected", ncclInvalidUsage, at the first push); slime colocates with tensor mode for this reason."""
    c = cfg.cluster
    if c.colocate and c.device == "cuda":
        yield Problem(
            "rollout.weight_sync.mode",
            "distributed",
            "colocated on GPUs, a training rank and an engine rank share each GPU, and NCCL refuses two ranks of one "
            "group on one device",
            "set rollout.weight_sync.mode=tensor (CUDA IPC on each GPU) or disk, or cluster.colocate=false",
        )


ON_MISMATCH = ("fail", "resync")  # rollout.weight_sync.on_mismatch (slime.sync.verify)


def check_verify(cfg: RunConfig) -> Iterator[Problem]:
    """`on_mismatch` names what a failed verification does; resync restarts engines, which fault tolerance allows."""
    ws = cfg.rollout.weight_sync
    if ws.on_mismatch not in ON_MISMATCH:
        yield Problem(
            "rollout.weight_sync.on_mismatch",
            ws.on_mismatch,
            f"unknown; one of {', '.join(ON_MISMATCH)}",
            "set rollout.weight_sync.on_mismatch=fail (stop the run) or resync (restart the engine and push again)",
        )
    if cfg.debug.corrupt_push_version is not None and not ws.verify:
        yield Problem(
            "debug.corrupt_push_version",
            cfg.debug.corrupt_push_version,
            "it tests the verification of pushes, which rollout.weight_sync.verify=false turns off",
            "set rollout.weight_sync.verify=true, or drop debug.corrupt_push_version",
        )
    if ws.on_mismatch == "resync" and not ws.verify:
        yield Problem(
            "rollout.weight_sync.on_mismatch",
            ws.on_mismatch,
            "resync acts on a failed verification, and rollout.weight_sync.verify=false turns verification off",
            "set rollout.weight_sync.verify=true, or drop rollout.weight_sync.on_mismatch",
        )
    if ws.probe_tokens < 0:
        yield Problem(
            "rollout.weight_sync.probe_tokens", ws.probe_tokens, "must be >= 0", "set it to 0 (no probe) or more"
        )
    if ws.probe_tolerance is not None and not ws.probe_tolerance > 0:
        yield Problem(
            "rollout.weight_sync.probe_tolerance",
            ws.probe_tolerance,
            "must be > 0 (a mean |log-prob difference|)",
            "set it above 0, or null for the precision's tolerance (fp32 1e-3, bf16 0.1)",
        )


DELTA_MODES = ("tensor", "distributed")  # a delta push's pairs stay in one bucket of these transports


def check_delta(cfg: RunConfig) -> Iterator[Problem]:
    """Delta pushes need an engine that writes changed bits into its weights (the built-in engine), a transport that
    keeps a bucket's tensors together, the engines' dtype (learnt by verification) and whole weights to diff."""
    ws = cfg.rollout.weight_sync
    if ws.full_every < 1:
        yield Problem("rollout.weight_sync.full_every", ws.full_every, "must be >= 1", "set it to 1 or more")
    if not ws.delta:
        return
    needs = (
        (ENGINES.facts(cfg.rollout.engine).applies_weight_deltas, "rollout.engine", cfg.rollout.engine,
         "only the built-in engine applies deltas", "set rollout.engine=hf, or rollout.weight_sync.delta=false"),
        (ws.mode in DELTA_MODES, "rollout.weight_sync.mode", ws.mode, "a delta push is sent in tensor or distributed mode",
         "set rollout.weight_sync.mode=tensor (colocated) or distributed"),
        (ws.verify, "rollout.weight_sync.verify", False, "a delta is taken in the engines' dtype, which verification learns",
         "set rollout.weight_sync.verify=true"),
        (not cfg.model.lora.synced_alone, "rollout.weight_sync.delta", True, "an adapter-only sync moves the adapter alone",
         "set rollout.weight_sync.delta=false, or model.lora.sync_merged=true"),
    )  # fmt: skip
    for ok, key, value, why, fix in needs:
        if not ok:
            yield Problem(key, value, f"with rollout.weight_sync.delta=true: {why}", fix)


# Server fields the adapter sync sets (EngineLaunch.lora: slime.engine.sglang.engine, slime.engine.vllm.engine)
SERVER_LORA_FIELDS = {
    "rollout.sglang": ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch", "lora_paths"),
    "rollout.vllm": ("enable_lora", "max_lora_rank", "max_loras", "lora_modules"),
}
MERGED = "set model.lora.sync_merged=true (the merged weights move instead)"


def check_adapter_sync(cfg: RunConfig) -> Iterator[Problem]:
    """model.lora synced alone (`sync_merged: false`): a mode with an adapter transfer that the engines take, a check
    the engines can make, and no server LoRA flag of the user's. Trained base weights (`train_params`) ride along in
    every such mode (slime.sync.adapter)."""
    lora, mode, engine = cfg.model.lora, cfg.rollout.weight_sync.mode, cfg.rollout.engine
    if not lora.synced_alone or mode not in WEIGHT_SYNC or engine not in ENGINES:
        return
    if WEIGHT_SYNC.facts(mode).adapter_sync is None:
        yield Problem(
            "rollout.weight_sync.mode",
            mode,
            "moves full weights only; the LoRA adapter alone moves in tensor or disk mode (model.lora.sync_merged=false)",
            f"set rollout.weight_sync.mode=disk (or tensor with cluster.colocate=true), or {MERGED}",
        )
    elif mode not in ENGINES.facts(engine).lora_adapter_modes:
        yield _engine_problem(engine, mode, ENGINES.facts(engine).lora_adapter_modes)
    if cfg.debug.check_weight_update_equal:
        yield from _check_problems(cfg)
    yield from _server_lora_fields(cfg)


def _check_problems(cfg: RunConfig) -> Iterator[Problem]:
    """debug.check_weight_update_equal on an adapter sync: each adapter tensor is checked as it loads (tensor mode's
    expected_checksums), each trained base weight by the engines' checksum after the push, on the CPU."""
    lora, mode, engine = cfg.model.lora, cfg.rollout.weight_sync.mode, cfg.rollout.engine
    if not WEIGHT_SYNC.facts(mode).checks_adapters:
        yield Problem(
            "debug.check_weight_update_equal",
            True,
            f"an adapter's {mode} sync carries no checksums to check it by (tensor mode's does: SGLang's "
            "expected_checksums)",
            f"set rollout.weight_sync.mode=tensor, debug.check_weight_update_equal=false, or {MERGED}",
        )
    elif lora.train_params and cfg.cluster.device == "cuda" and ENGINES.facts(engine).gpu_weight_checksums:
        yield Problem(
            "debug.check_weight_update_equal",
            True,
            f"the trained base weights (model.lora.train_params) cannot be checked on {engine} servers on GPUs: "
            "their /weights_checker hashes a GPU tensor with a hash of its own, which the trainer cannot reproduce",
            f"set debug.check_weight_update_equal=false, model.lora.train_params=[], or {MERGED}",
        )


def _engine_problem(engine: str, mode: str, modes: tuple[str, ...]) -> Problem:
    if not modes:
        return Problem("rollout.engine", engine, "its servers take no LoRA adapter at run time", MERGED)
    return Problem(
        "rollout.engine",
        engine,
        f"its servers load a LoRA adapter at run time in {' or '.join(modes)} mode only, not {mode}",
        f"set rollout.weight_sync.mode={modes[0]}, or {MERGED}",
    )


def _server_lora_fields(cfg: RunConfig) -> Iterator[Problem]:
    for key, fields in SERVER_LORA_FIELDS.items():
        given = get(cfg, key) or {}
        owned = sorted(set(fields) & {name for name, value in given.items() if value is not None})
        if owned:
            yield Problem(
                key,
                owned,
                "set by the adapter sync on every server (model.lora.rank, target_modules)",
                f"remove {', '.join(f'{key}.{name}' for name in owned)}",
            )
