"""Engine-test fixtures on top of tests/conftest.py's `tiny_model_dir`: one torch thread, the loaded model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """2-core CI box shared with other jobs: more than one intra-op thread makes tiny matmuls crawl."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """(model, tokenizer) loaded in float32 on CPU, eval mode. Treat as read-only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)
