"""The bench's model for `python main.py` runs on a GPU: its random Qwen3-1.7B-shaped checkpoint with a tokenizer."""

from __future__ import annotations

from pathlib import Path

from slime.assets.tokenizer import build_tokenizer
from tools.bench_train_steps import compose, write_model


def write_bench_model(model_dir: str | Path, device: str = "cuda") -> str:
    """`tools/bench_train.py`'s checkpoint (random bf16 weights of model=qwen3_1_7b) in `model_dir`, with the embedded
    run's word-level tokenizer beside it, so that a run can template the digit task's prompts (generated ids past
    the tokenizer's few words decode to nothing); returns the directory."""
    model_dir = str(model_dir)
    write_model(compose("qwen3_1p7b", device, model_dir, []), model_dir, device)
    build_tokenizer(model_dir)
    return model_dir
