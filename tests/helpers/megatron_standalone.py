"""The megatron actor without Ray or Hydra, for the megatron tests (CPU and GPU): one process, one rank.

Import it after `pytest.importorskip("megatron.core")`.

    backend = build(model_cfg, device="cuda", precision="bf16", max_tokens_per_gpu=16384)
    metrics = train_step(backend, [(tokens, loss_mask), ...])   # one optimizer step, GRPO loss
    log_probs = forward_log_probs(backend, [(tokens, loss_mask), ...])

A sample is (prompt + response token ids, one 0/1 per response token): its response is the last
len(loss_mask) tokens. `train_step` gives the samples alternating advantages +1/−1 (a GRPO step
without KL, so one forward+backward per micro-batch and no old-log-prob pass), then runs one
optimizer step through the same code as a run (`MegatronBackend.train`).
"""

from __future__ import annotations

import dataclasses

from slime.config.schema import AlgoConfig, CheckpointConfig, ModelConfig, ParallelismConfig, TrainConfig
from slime.net import free_port
from slime.rollout.postprocess import split_for_data_parallel
from slime.run_schema import schema_class
from slime.train.layout import RankLayout
from slime.train.megatron.backend import MegatronBackend
from slime.train.train_setup import TrainSetup
from slime.types import Sample, TrainBatch

Samples = list[tuple[list[int], list[int]]]


def build(
    model_cfg: ModelConfig,
    *,
    device: str = "cuda",
    precision: str = "bf16",
    lr: float = 1e-6,
    max_tokens_per_gpu: int | None = None,
    parallelism: ParallelismConfig | None = None,
    num_optimizer_steps: int = 1000,
    seed: int = 1234,
):
    """A built single-rank MegatronBackend for `model_cfg` (weights from `model_cfg.hf_checkpoint`)."""
    p = parallelism or schema_class("parallelism")(backend="megatron")
    p = dataclasses.replace(p, backend="megatron", max_tokens_per_gpu=max_tokens_per_gpu or p.max_tokens_per_gpu)
    setup = TrainSetup(
        model=model_cfg,
        parallelism=p,
        train=TrainConfig(num_rollout=1, lr=lr),
        algo=AlgoConfig(name="grpo", use_kl_loss=False, kl_loss_coef=0.0),
        checkpoint=CheckpointConfig(),
        device=device,
        precision=precision,
        temperature=1.0,
        max_response_len=1 << 20,  # only the Dr.GRPO constant reads it
        seed=seed,
        num_optimizer_steps=num_optimizer_steps,
    )
    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    backend.init()
    return backend


def to_batch(samples: Samples) -> TrainBatch:
    """One optimizer step's TrainBatch of `samples`, advantages alternating +1 / −1."""
    records = [
        Sample(index=i, tokens=list(tokens), response_length=len(mask), loss_mask=list(mask), reward=float(i % 2 == 0))
        for i, (tokens, mask) in enumerate(samples)
    ]
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(records))]
    raw = [r.reward for r in records]
    return split_for_data_parallel(records, raw, advantages, step_sizes=[len(records)], dp_size=1)[0]


def train_step(backend, samples: Samples) -> dict[str, float]:
    """One optimizer step on `samples`; the step's `train/*` metrics (loss, grad_norm, lr, ...)."""
    backend.load_batch(0, to_batch(samples))
    backend.compute_advantages()
    return backend.train()["steps"][0]


def forward_log_probs(backend, samples: Samples):
    """Forward-only log-probs of every response token, flat Tensor[N] (fp32) in sample order."""
    backend.load_batch(0, to_batch(samples))
    backend.compute_log_probs("old")
    return backend.columns["old_log_probs"]
