"""Log-probs of one batch from the megatron backend (one CPU rank) and from transformers' own forward, for the
tests that hold the two equal (tests/train/megatron: the tiny families and SmolLM2)."""

from __future__ import annotations

import torch

from slime.algo.logprobs import log_probs_and_entropy, response_logits_slice
from slime.train.layout import RankLayout
from slime.train.megatron.backend import MegatronBackend
from slime.train.megatron.model_config import compile_layers
from tests.helpers.fsdp_rank import train_rollout


def hf_log_probs(model_dir: str, batch, temperature: float) -> torch.Tensor:
    """transformers' own forward, one unpacked sample at a time: flat response log-probs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for tokens, response in zip(batch.tokens, batch.response_lengths):
            logits = model(torch.tensor([tokens])).logits[0]
            rows = logits[response_logits_slice(len(tokens) - response, response)]
            out.append(
                log_probs_and_entropy(
                    rows, torch.tensor(tokens[-response:]), temperature=temperature, with_entropy=False
                )[0]
            )
    return torch.cat(out)


def megatron_run(setup, batch, port: int, *, train: bool = False, compile_backend: str | None = None) -> dict:
    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=port)
    backend.init()
    if compile_backend is not None:
        compile_layers([chunk.module for chunk in backend.model], backend=compile_backend)
    try:
        backend.load_batch(0, batch)
        backend.compute_log_probs("old")
        result = {"log_probs": backend.columns["old_log_probs"].clone()}
        if train:
            result["steps"] = train_rollout(backend, batch)["steps"]
        return result
    finally:
        backend.shutdown()
