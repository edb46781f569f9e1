"""HF <-> torch_dist conversion in one CPU process (tools/convert_hf_to_torch_dist.py,
tools/convert_torch_dist_to_hf.py): no Ray, no GPU; torch.distributed of world size 1 over gloo.

The model shape comes from the HF `config.json` (slime.models.families), the parameter dtype from its
`torch_dtype`/`dtype` (so a bf16 checkpoint round-trips bit for bit); parameters are not randomly
initialised first, since every one is overwritten.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from slime.config.schema import ModelConfig, ParallelismConfig
from slime.models.families import model_fields_from_hf
from slime.net import free_port
from slime.train.layout import RankLayout
from slime.train.megatron import checkpoint, hf_weights, parallel
from slime.train.megatron.checkpoint import RELEASE, TRACKER
from slime.train.megatron.model_config import build_model_chunks, transformer_config
from slime.train.megatron.weights.names import check_supported
from slime.wire.hf_dir import write_hf_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hf_model_config(hf_dir: str | Path) -> ModelConfig:
    """The ModelConfig of the HF checkpoint at `hf_dir` (its config.json)."""
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    return ModelConfig(name=Path(hf_dir).name, hf_checkpoint=str(hf_dir), **model_fields_from_hf(config))


def hf_dtype(hf_dir: str | Path) -> torch.dtype:
    """The parameter dtype an HF config.json declares (float32 when it declares none)."""
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    return _DTYPES.get(config.get("torch_dtype") or config.get("dtype"), torch.float32)


@contextlib.contextmanager
def single_process_model(model: ModelConfig, dtype: torch.dtype) -> Iterator[list]:
    """This process as the only megatron rank (gloo, CPU shims) with `model` built; torn down after."""
    check_supported(model)
    parallel.init(
        device="cpu",
        rank=0,
        layout=RankLayout(dp=1),
        vpp=None,
        master_addr="127.0.0.1",
        master_port=free_port(),
        seed=0,
    )
    try:
        extra = {"perform_initialization": False}
        if model.num_experts:  # nothing is routed here: the plain all-gather dispatcher needs no CUDA streams
            extra.update(moe_token_dispatcher_type="allgather", variable_seq_lengths=False)
        config = transformer_config(model, ParallelismConfig(), params_dtype=dtype, device="cpu", extra=extra)
        yield build_model_chunks(model, config)
    finally:
        parallel.destroy()


def checkpoint_root(input_dir: str | Path) -> tuple[Path, int | str | None]:
    """(root, iteration) for a torch_dist ROOT (iteration None: its tracker's) or one of its iter_/release
    directories, which slime's conversion command passes."""
    path = Path(input_dir).resolve()
    if (path / TRACKER).exists():
        return path, None
    if path.name == RELEASE:
        return path.parent, RELEASE
    if path.name.startswith("iter_") and path.name[5:].isdigit():
        return path.parent, int(path.name[5:])
    raise FileNotFoundError(f"{input_dir}: neither a torch_dist root (with {TRACKER}) nor an iter_XXXXXXX/release dir")


def hf_to_torch_dist(hf_dir: str | Path, save: str | Path) -> Path:
    """Convert the HF checkpoint at `hf_dir` into `save/release` (tracker "release"); returns that dir."""
    model = hf_model_config(hf_dir)
    with single_process_model(model, hf_dtype(hf_dir)) as chunks:
        hf_weights.load_hf(chunks, hf_dir, model)
        return checkpoint.save_weights(chunks, save)


def torch_dist_to_hf(input_dir: str | Path, output_dir: str | Path, origin_hf_dir: str | Path) -> int:
    """Write the model of a torch_dist checkpoint as an HF directory (config and tokenizer copied from
    `origin_hf_dir`, which also gives the architecture); returns the bytes of weights written."""
    model = hf_model_config(origin_hf_dir)
    dtype = hf_dtype(origin_hf_dir)
    root, iteration = checkpoint_root(input_dir)
    with single_process_model(model, dtype) as chunks:
        checkpoint.load_weights(chunks, root, model, ckpt_step=iteration)
        # megatron's norms stay float32 whatever params_dtype is: write every tensor in the checkpoint's dtype
        buckets = (
            [(name, t.to(dtype)) for name, t in bucket] for bucket in hf_weights.export_hf(chunks, model, 1 << 30)
        )
        return write_hf_dir(buckets, output_dir, source_checkpoint=origin_hf_dir)
