"""Shared fixtures for the engine tests: one tiny Qwen3 model per test session (CPU, ~0.1M params)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """2-core CI box shared with other jobs: more than one intra-op thread makes tiny matmuls crawl."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Path of an HF checkpoint dir (config, tokenizer, safetensors) of `conf/model/tiny_qwen3.yaml`."""
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = yaml.safe_load((ROOT / "conf" / "model" / "tiny_qwen3.yaml").read_text())
    fields["hf_checkpoint"] = str(tmp_path_factory.mktemp("models") / "tiny_qwen3")
    return str(create_tiny_model(ModelConfig(**fields)))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """(model, tokenizer) loaded in float32 on CPU, eval mode. Treat as read-only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)
