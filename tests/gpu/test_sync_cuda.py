"""GPU tier: tensor (CUDA IPC) and distributed (NCCL) weight syncs from a CUDA fsdp rank into a bf16 hf engine;
the engine's weights equal the trainer's cast to bf16, bit for bit. Distributed needs a second GPU (NCCL
refuses two ranks on one device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime.engine import http_client
from slime.engine.hf.weight_checker import tensor_checksum
from slime.net import free_port
from slime.sync.base import SyncContext
from tests.helpers.engines import start_engine
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.weights import engine_checksums

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def trained_cuda(tiny_model_dir):
    # the GPU image has neither wandb nor sglang-router, which validation asks of a whole run
    overrides = ["train.lr=0.05", "logger.wandb.mode=disabled", "rollout.router.address=127.0.0.1:1"]
    setup = dataclasses.replace(make_setup(tiny_model_dir, overrides), device="cuda", precision="bf16")
    backend = make_backend(setup, port=free_port())
    train_rollout(backend, batches_for(make_samples(8, seed=5), dp=1, k=2)[0])
    yield backend
    backend.shutdown()


@pytest.mark.parametrize("mode,gpu", [("tensor", "0"), ("distributed", "1")])
def test_cuda_sync_is_bit_exact(trained_cuda, tiny_model_dir, tmp_path, mode, gpu):
    if int(gpu) >= torch.cuda.device_count():
        # NCCL refuses two ranks on one GPU, so the distributed case needs the engine on a second GPU
        pytest.skip(f"{mode} sync puts the engine on GPU {gpu}; this machine has {torch.cuda.device_count()} GPU(s)")
    engine = start_engine(tiny_model_dir, tmp_path / "logs", device="cuda", gpu_ids=(gpu,), dtype="bfloat16")
    try:
        context = SyncContext(
            source_checkpoint=tiny_model_dir,
            work_dir=str(tmp_path),
            bucket_bytes=20_000,
            check_weight_update_equal=True,
        )
        trained_cuda.connect_weight_sync(mode, [engine.url], context)
        buckets = list(trained_cuda.export_weights(20_000))
        assert all(t.is_cuda for b in buckets for _, t in b)
        trained_cuda.update_weights(weight_version=2)
        expected = {n: tensor_checksum(t.to(torch.bfloat16)) for b in buckets for n, t in b}
        assert engine.client.get_weight_version() == "2" and engine_checksums(engine.url) == expected
        body = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        assert http_client.post(engine.url + "/generate", body)["meta_info"]["weight_version"] == "2"
    finally:
        trained_cuda.close_weight_sync()
        engine.shutdown()
