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


def test_a_gpu_tensor_has_the_cpu_tensors_digest():
    """slime.wire.weight_digest sums the bits where the tensor is: the same digest on the GPU as on the CPU."""
    from slime.wire.weight_digest import digests

    tensors = [torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16) for n in (5, 70_001)]
    assert digests([t.cuda() for t in tensors]) == digests(tensors)


def test_the_triton_block_sums_are_torchs_reduction_at_every_size_and_extreme():
    """The Triton kernel (slime.wire.digest_kernel) against torch's int64 reduction of the same blocks: ragged last
    blocks, one-byte dtypes widened, blocks of the extreme halves (their sums reach -2**27 and 2**27 - 4096), empty
    tensors, and tensors off a 16-byte boundary, each alone and all in one launch."""
    from slime.wire.digest_kernel import block_sums_cuda
    from slime.wire.weight_digest import DIGEST_BLOCK, _cuda_kernel, halves

    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(n, generator=gen).to(dtype)
        for n in (1, 4095, 4096, 4097, 3 * 4096 + 5)
        for dtype in (torch.bfloat16, torch.float32)
    ]
    tensors += [torch.randint(0, 256, (9000,), generator=gen, dtype=torch.uint8), torch.zeros(0)]
    tensors += [torch.full((2 * DIGEST_BLOCK,), value, dtype=torch.int16) for value in (-32768, 32767)]
    flat = [halves(t.cuda()) for t in tensors]
    flat += [flat[2][1:], flat[4][3:-1]]  # 2 and 6 bytes past an allocation's start
    expected = []
    for x in flat:
        padded = torch.nn.functional.pad(x, (0, -x.numel() % DIGEST_BLOCK))
        expected.append(padded.view(-1, DIGEST_BLOCK).sum(dim=1, dtype=torch.int64))
        assert torch.equal(block_sums_cuda([x], DIGEST_BLOCK), expected[-1]), (x.dtype, x.numel())
    assert torch.equal(block_sums_cuda(flat, DIGEST_BLOCK), torch.cat(expected))
    assert torch.equal(block_sums_cuda(flat[:-2], DIGEST_BLOCK), torch.cat(expected[:-2]))  # all on 16-byte starts
    assert _cuda_kernel(flat[0].device) is block_sums_cuda  # the digests use it


def test_a_push_ledger_digests_on_the_transfers_thread_what_the_general_way_digests():
    """PushLedger launches a bucket's block sums from its tensors' addresses on the transfer's own thread where the
    built-in engine holds them as they are (one known serving dtype): the digests equal those of the general way (a
    thread of the ledger's, views and record_stream), for buckets that take either way and tensors whose memory is
    freed and reused right after the bucket passed."""
    from slime.sync.push_ledger import SERVING_DTYPES, PushLedger
    from slime.wire import weight_digest

    gen = torch.Generator().manual_seed(1)

    def buckets():
        yield [
            (f"layer.{n}.weight", torch.randn(n, generator=gen).to(torch.bfloat16).cuda()) for n in (1, 4097, 70_001)
        ]
        fp32 = ("norm.weight", torch.randn(3, generator=gen).cuda())  # a bf16 engine's is a cast: the general way
        yield [("layer.steps", torch.arange(9, device="cuda")), fp32]
        odd = torch.randn(64, 64, generator=gen).to(torch.bfloat16).cuda().t()  # not contiguous: the general way
        yield [("layer.odd.weight", odd)]

    def pushed(dtypes):
        ledger = PushLedger(hashed=weight_digest.DIGEST, packed={}, tied=False, dtypes=dtypes)
        for bucket in ledger.watch(buckets()):
            del bucket
            torch.randn(1 << 20, device="cuda")  # the freed memory taken again at once
        ledger.wait()
        return {name: p.digests for name, p in ledger.pushed.items()}

    gen.manual_seed(1)
    in_place = pushed((torch.bfloat16,))
    gen.manual_seed(1)
    general = pushed(SERVING_DTYPES)
    assert in_place.keys() == general.keys() and len(in_place) == 6
    for name, digests in in_place.items():
        assert digests.items() <= general[name].items(), name
    gen.manual_seed(1)
    expected = [t for bucket in buckets() for _, t in bucket]
    assert in_place["layer.70001.weight"]["torch.bfloat16"] == weight_digest.digests([expected[2]])[0]
    assert in_place["layer.steps"][""] == weight_digest.digests([expected[3]])[0]


def test_a_verified_cuda_sync_compares_the_engines_own_digests(trained_cuda, tiny_model_dir, tmp_path):
    """A verified tensor-mode push into a bf16 engine on the GPU: the trainer's fp32 export is digested in every serving
    dtype on the first push, matched in bf16, and later pushes digest bf16 only."""
    from slime.sync.push_ledger import SERVING_DTYPES

    engine = start_engine(tiny_model_dir, tmp_path / "logs", device="cuda", gpu_ids=("0",), dtype="bfloat16")
    context = SyncContext(
        source_checkpoint=tiny_model_dir, engine="hf", work_dir=str(tmp_path), bucket_bytes=1 << 20, verify=True
    )
    try:
        trained_cuda.connect_weight_sync("tensor", [engine.url], context)
        assert trained_cuda.weight_sync.verifier.dtypes == SERVING_DTYPES
        assert trained_cuda.update_weights(weight_version=1)["perf/update_weights_verify_time"] > 0
        assert trained_cuda.weight_sync.verifier.dtypes == (torch.bfloat16,)
        trained_cuda.update_weights(weight_version=2)
    finally:
        trained_cuda.close_weight_sync()
        engine.shutdown()


def test_a_delta_push_into_a_bf16_engine_on_the_gpu_is_bit_identical(trained_cuda, tiny_model_dir, tmp_path):
    """Delta pushes from the fp32 CUDA trainer into a bf16 engine: the delta is taken in bf16 (the dtype the first
    push's verification learnt), carries a small share of the bytes, and the verification finds every tensor equal."""
    engine = start_engine(tiny_model_dir, tmp_path / "logs", device="cuda", gpu_ids=("0",), dtype="bfloat16")
    context = SyncContext(
        source_checkpoint=tiny_model_dir, engine="hf", work_dir=str(tmp_path), bucket_bytes=1 << 20, verify=True,
        delta_full_every=10,
    )  # fmt: skip
    try:
        trained_cuda.connect_weight_sync("tensor", [engine.url], context)
        full = trained_cuda.update_weights(weight_version=1)["perf/update_weights_bytes"]
        with torch.no_grad():
            trained_cuda.model.model.layers[0].mlp.up_proj.weight.mul_(1.01)
        delta = trained_cuda.update_weights(weight_version=2)
        assert 0 < delta["perf/update_weights_bytes"] < 0.2 * full
        exported = [pair for bucket in trained_cuda.export_weights(1 << 20) for pair in bucket]
        assert engine_checksums(engine.url) == {name: tensor_checksum(t.to(torch.bfloat16)) for name, t in exported}
    finally:
        trained_cuda.close_weight_sync()
        engine.shutdown()
