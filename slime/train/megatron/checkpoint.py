"""Megatron checkpoints in torch_dist, laid out as slime's (docs/checkpoints.md#layout).

    <root>/latest_checkpointed_iteration.txt    the last complete rollout id, or "release"
    <root>/iter_0000007/                        megatron dist_checkpointing directory (*.distcp, common.pt)
    <root>/release/                             a converted model (weights only; tools/convert_hf_to_torch_dist.py)

A checkpoint holds every model chunk's sharded state dict (global tensor names: any tp/pp/vpp/ep layout
loads it), the distributed optimizer in megatron's `dp_reshardable` format (reloads into the same
tp/pp/ep layout at any dp size; left out with `checkpoint.no_save_optim`), the LR scheduler, the step
counters, and each rank's RNG states (restored only on the same world size). Pass the ROOT, never an iter_ directory; `ckpt_step` picks an
iteration, else the tracker does. A save is atomic (slime.train.checkpoint_files): every rank writes into
`.iter_0000007.partial/`, renamed once complete, then the tracker is replaced; an interrupted save (a
re-save of the tracker's own iteration included) never damages the checkpoint a resume picks.

`load` is the actor's resume: a root with a tracker restores everything and returns iteration + 1; a
missing root or one without a tracker falls back to `checkpoint.ref_load` (weights only, rollout 0),
like slime's `--load`. `load_weights` reads weights only, from an HF directory or a torch_dist root.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

from slime.config.schema import ModelConfig
from slime.train.checkpoint_files import disk_checked, publish, replace_text, staging_dir
from slime.train.megatron.hf_weights import load_hf, load_hf_main_params, unwrap

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
# megatron-training's default: the distributed optimizer's buffers as saved, reloadable at another dp size.
# (fully_reshardable, which any layout reloads, fails to load without Apex/TE in megatron-core 0.16.1:
# it skips torch Adam's `step` when copying the saved state into the live one.)
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True}


def iter_dir(root: str | Path, iteration: int | str) -> Path:
    return Path(root) / (RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}")


def read_tracker(root: str | Path) -> int | str | None:
    """The tracker's iteration (an int, or "release"); None without a tracker file."""
    tracker = Path(root) / TRACKER
    if not tracker.exists():
        return None
    text = tracker.read_text().strip()
    return RELEASE if text == RELEASE else int(text)


def is_hf_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / "config.json").exists() and any(path.glob("*.safetensors"))


def checkpoint_dir(root: str | Path, ckpt_step: int | None) -> tuple[Path, int | str]:
    """(directory, iteration) of the checkpoint under `root`: `ckpt_step` if given, else the tracker's."""
    iteration = ckpt_step if ckpt_step is not None else read_tracker(root)
    if iteration is None:
        raise FileNotFoundError(f"{root}: no {TRACKER}; pass the checkpoint ROOT (not an iter_ directory)")
    path = iter_dir(root, iteration)
    if not path.is_dir():
        raise FileNotFoundError(f"{root}: iteration {iteration} has no directory {path.name}")
    return path, iteration


def _model_keys(models: list) -> list[str]:
    return ["model"] if len(models) == 1 else [f"model{i}" for i in range(len(models))]


def _model_state(chunks, *, without_head: bool = False) -> dict:
    """Every chunk's sharded state dict; `without_head`: a critic's value head left out (not in a policy's)."""
    models = unwrap(chunks)
    state = {key: model.sharded_state_dict() for key, model in zip(_model_keys(models), models)}
    if without_head:
        for chunk_state in state.values():
            for name in [n for n in chunk_state if n.startswith("output_layer.")]:
                del chunk_state[name]
    return state


def _apply_model_state(chunks, loaded: dict, *, without_head: bool = False) -> None:
    models = unwrap(chunks)
    for model, key in zip(models, _model_keys(models)):
        model.load_state_dict(loaded[key], strict=not without_head)


def _rng_state() -> dict:
    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_object(state: dict | None):
    """Each rank's RNG as its own sharded object (offset = global rank)."""
    return ShardedObject("rng_state", state, (dist.get_world_size(),), (dist.get_rank(),), replica_id=0)


def _ensure_optimizer_state(optimizer) -> None:
    """Zero Adam state (step 0) for parameters that have none: megatron's distributed optimizer reads the
    per-parameter `step` of torch's Adam while building the state dict to load into, and a fresh one has none."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        for group in inner.param_groups:
            for param in group["params"]:
                if not inner.state[param]:
                    inner.state[param].update(
                        step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param)
                    )


def _restore_adam_steps(optimizer, saved: dict) -> None:
    """Put back torch Adam's per-parameter `step` (bias correction) from the saved param groups: without
    Apex/TE, megatron-core 0.16.1 restores it from them, then overwrites it with the loading placeholder."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    saved_parts = [saved] if len(parts) == 1 else [saved[i] for i in sorted(saved)]
    for part, state in zip(parts, saved_parts):
        inner = part.optimizer
        for group, saved_group in zip(inner.param_groups, state["optimizer"]["param_groups"]):
            for param in group["params"]:
                if "step" in saved_group and "step" in inner.state[param]:
                    inner.state[param]["step"] = torch.tensor(float(saved_group["step"]))


def _full_state(backend, *, with_optimizer: bool, rng: dict | None, loading: bool) -> dict:
    state = _model_state(backend.model)
    if with_optimizer:
        if loading:
            _ensure_optimizer_state(backend.optimizer)
        model_state = dict(state)
        state["optimizer"] = backend.optimizer.sharded_state_dict(
            model_state, is_loading=loading, metadata=OPTIMIZER_METADATA
        )
        state["opt_param_scheduler"] = backend.scheduler.state_dict()
    if rng is not None or loading:
        state["rng_state"] = _rng_object(rng)
    return state


def _fresh_dir(path: Path) -> None:
    """An empty `path` (dist_checkpointing writes into an existing, empty directory), made by rank 0."""
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()


def _commit(staging: Path, final: Path, root: Path, iteration: int | str) -> None:
    """Every rank's shards are in `staging`: rank 0 renames it to `final`, then replaces the tracker."""
    dist.barrier()
    if dist.get_rank() == 0:
        publish(staging, final)
        replace_text(root / TRACKER, str(iteration))
    dist.barrier()


def save(backend, root: Path, rollout_id: int) -> None:
    """Model, optimizer, scheduler, counters and RNG for `rollout_id` under `root`; collective."""
    with_optimizer = not backend.setup.checkpoint.no_save_optim
    state = _full_state(backend, with_optimizer=with_optimizer, rng=_rng_state(), loading=False)
    state.update(
        iteration=rollout_id,
        global_step=backend.global_step,
        world_size=dist.get_world_size(),
        has_optimizer=with_optimizer,
    )
    final = iter_dir(root, rollout_id)
    _fresh_dir(staging_dir(final))
    with disk_checked(Path(root), final):
        dist_checkpointing.save(state, str(staging_dir(final)))
    _commit(staging_dir(final), final, Path(root), rollout_id)


def save_weights(chunks, root: str | Path, *, iteration: int | str = RELEASE) -> Path:
    """Model weights only under `root` (default: the `release` directory of a conversion); collective."""
    target = iter_dir(root, iteration)
    _fresh_dir(staging_dir(target))
    state = _model_state(chunks)
    state.update(iteration=iteration, world_size=dist.get_world_size(), has_optimizer=False)
    dist_checkpointing.save(state, str(staging_dir(target)))
    _commit(staging_dir(target), target, Path(root), iteration)
    return target


def load_weights(
    chunks, path: str | Path, model_cfg: ModelConfig, *, ckpt_step: int | str | None = None, head: str = "lm"
) -> None:
    """Weights only into this rank's chunks, from an HF directory or a torch_dist root (its tracker's
    iteration, or `ckpt_step`); head="value" (a critic) keeps its value head as built. Call the optimizer's
    `reload_model_params()` afterwards if it exists (and `load_hf_main_params` for an HF directory)."""
    if read_tracker(path) is None and ckpt_step is None:
        if not is_hf_dir(path):
            raise FileNotFoundError(f"{path}: neither an HF model (config.json + *.safetensors) nor a torch_dist root")
        load_hf(chunks, path, model_cfg, head=head)
        return
    directory, _ = checkpoint_dir(path, ckpt_step)
    without_head = head == "value"
    loaded = dist_checkpointing.load(_model_state(chunks, without_head=without_head), str(directory))
    _apply_model_state(chunks, loaded, without_head=without_head)


def load(backend, root: str, ckpt_step: int | None) -> int:
    """`checkpoint.load` of a role (actor or critic): resume from `root` (returns iteration + 1), or without
    a tracker start from `checkpoint.ref_load`'s weights (returns 0); a `release` root gives weights only."""
    if ckpt_step is None and read_tracker(root) in (None, RELEASE):
        source = root if read_tracker(root) == RELEASE else backend.setup.checkpoint.ref_load
        if source is None:
            raise FileNotFoundError(f"checkpoint.load={root} has no {TRACKER} and checkpoint.ref_load is unset")
        logger.info("checkpoint.load=%s has no tracker: starting from %s (weights only)", root, source)
        head = getattr(backend, "head", "lm")
        load_weights(backend.model, source, backend.setup.model, head=head)
        backend.optimizer.reload_model_params()
        if is_hf_dir(source):
            load_hf_main_params(backend.optimizer, backend.model, source, backend.setup.model, head=head)
        return 0
    directory, iteration = checkpoint_dir(root, ckpt_step)
    common = dist_checkpointing.load_common_state_dict(str(directory))
    if iteration == RELEASE or not common.get("has_optimizer", False):  # a conversion, or no_save_optim
        head = getattr(backend, "head", "lm") if iteration == RELEASE else "lm"
        load_weights(backend.model, root, backend.setup.model, ckpt_step=iteration, head=head)
        backend.optimizer.reload_model_params()
        return 0 if iteration == RELEASE else int(iteration) + 1
    same_world = common.get("world_size") == dist.get_world_size()
    if not same_world:
        logger.warning(
            "%s was saved by %s ranks, this run has %s: RNG states not restored",
            directory,
            common.get("world_size"),
            dist.get_world_size(),
        )
    state = _full_state(backend, with_optimizer=True, rng=None, loading=True)
    if not same_world:
        state.pop("rng_state")
    loaded = dist_checkpointing.load(state, str(directory))
    _apply_model_state(backend.model, loaded)
    with torch.no_grad():  # fp32 parameters are their own main params: leaf views the state is copied into
        backend.optimizer.load_state_dict(loaded["optimizer"])
    _restore_adam_steps(backend.optimizer, loaded["optimizer"])
    backend.scheduler.load_state_dict(loaded["opt_param_scheduler"])
    backend.global_step = loaded["global_step"]
    if same_world:
        _set_rng_state(loaded["rng_state"])
    return int(iteration) + 1
