"""Checkpoints of the fsdp backend (docs/checkpoints.md#layout, HF weights inside).

    <root>/latest_checkpointed_iteration.txt      the last complete rollout id
    <root>/iter_0000007/model/                    HF safetensors + config + tokenizer; with model.lora the
                                                  adapters alone (adapter_model.safetensors: the base is
                                                  model.hf_checkpoint, never trained)
    <root>/iter_0000007/optimizer.pt              AdamW + LR scheduler + step counter (full state)
    <root>/iter_0000007/rng_rank<r>.pt            Python, NumPy and torch RNG states per rank

Full (unsharded) state dicts through torch.distributed.checkpoint.state_dict work for a plain module
and for FSDP2 alike; rank 0 writes. A save is atomic (slime.train.checkpoint_files): staged, renamed,
then the tracker replaced; a save killed at any point leaves the previous checkpoint the one a resume picks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from slime.train.checkpoint_files import disk_checked, replace_text, staging_dir
from slime.train.checkpoint_files import publish as _publish
from slime.train.fsdp import lora, parallel
from slime.train.rng import rng_state, set_rng_state
from slime.wire.hf_dir import copy_side_files

TRACKER = "latest_checkpointed_iteration.txt"
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
ADAPTER_FILE = "adapter_model.safetensors"  # peft's name for an adapter's weights


def iter_dir(root: Path, rollout_id: int) -> Path:
    return root / f"iter_{rollout_id:07d}"


def save_model_dir(backend, path: Path) -> None:
    """The role's own model class as an HF directory (the critic's value head included), tokenizer
    files copied from the source checkpoint; rank 0 writes."""
    state = get_model_state_dict(backend.model, options=_FULL)
    if backend.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        if backend.trains_adapters:
            save_file(
                {k: v.contiguous() for k, v in lora.trained_state(state, backend.setup.model.lora).items()},
                str(path / ADAPTER_FILE),
            )
        else:
            backend.model.save_pretrained(str(path), state_dict=state, safe_serialization=True)
            copy_side_files(backend.setup.model.hf_checkpoint, path)
    parallel.barrier()


def save(backend, root: Path, rollout_id: int) -> None:
    final = iter_dir(root, rollout_id)
    target = staging_dir(final)
    if backend.rank == 0 and target.exists():  # a save of this id that was killed
        shutil.rmtree(target)
    with disk_checked(root, final):
        save_model_dir(backend, target / "model")
        if not backend.setup.checkpoint.no_save_optim:
            optim_state = get_optimizer_state_dict(backend.model, backend.optimizer, options=_FULL)
            if backend.rank == 0:
                torch.save(
                    {
                        "optimizer": optim_state,
                        "scheduler": backend.scheduler.state_dict(),
                        "global_step": backend.global_step,
                    },
                    target / "optimizer.pt",
                )
        torch.save(rng_state(), target / f"rng_rank{backend.rank}.pt")
        parallel.barrier()
        if backend.rank == 0:
            _publish(target, final)
    if backend.rank == 0:
        replace_text(root / TRACKER, str(rollout_id))
    parallel.barrier()


def latest_rollout_id(root: Path) -> int | None:
    tracker = root / TRACKER
    return int(tracker.read_text().strip()) if tracker.exists() else None


def _load_weights(backend, source: Path, root: str) -> None:
    """The model's weights from `source`: a checkpoint's adapters (LoRA; the base is already loaded), or an HF
    directory (with LoRA its weights become the base and the adapters keep their initialisation)."""
    if backend.trains_adapters and (source / ADAPTER_FILE).exists():
        adapters = load_file(str(source / ADAPTER_FILE))
        expected = {name for name, param in backend.model.named_parameters() if param.requires_grad}
        if set(adapters) != expected:
            raise ValueError(
                f"checkpoint.load={root}: the tensors in {source} are not what model.lora trains ({len(adapters)}, "
                f"{len(expected)} expected): resume with the model.lora the checkpoint was trained with"
            )
        options = StateDictOptions(full_state_dict=True, strict=False)  # the base is model.hf_checkpoint's
        set_model_state_dict(backend.model, adapters, options=options)
        return
    if not (source / "config.json").exists():
        raise FileNotFoundError(f"checkpoint.load={root}: no HF model at {source}")
    state = backend._load_model(str(source)).state_dict()  # the role's own model class (causal LM or value model)
    if backend.trains_adapters:
        state = lora.as_injected(state, backend.model)
    options = StateDictOptions(full_state_dict=True, strict=not backend.trains_adapters)
    set_model_state_dict(backend.model, state, options=options)


def load(backend, root: str, ckpt_step: int | None) -> int:
    """Restore model (+ optimizer, scheduler, RNG when saved); return the next rollout id.

    Without a tracker (or an explicit ckpt_step) the directory is treated as an HF model to fine-tune
    from, as slime does: weights only, rollout 0.
    """
    root_path = Path(root)
    rollout_id = ckpt_step if ckpt_step is not None else latest_rollout_id(root_path)
    source = iter_dir(root_path, rollout_id) / "model" if rollout_id is not None else root_path
    _load_weights(backend, source, root)
    if rollout_id is None:
        return 0
    target = iter_dir(root_path, rollout_id)
    if (target / "optimizer.pt").exists():
        saved = torch.load(target / "optimizer.pt", weights_only=True)
        set_optimizer_state_dict(
            backend.model, backend.optimizer, saved["optimizer"], options=StateDictOptions(full_state_dict=True)
        )
        backend.scheduler.load_state_dict(saved["scheduler"])
        backend.global_step = saved["global_step"]
    rng_file = target / f"rng_rank{backend.rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=True))
    return rollout_id + 1
