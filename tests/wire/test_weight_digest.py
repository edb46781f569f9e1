"""slime.wire.weight_digest: every flipped bit and byte changes a tensor's digest, a block's sum moved changes it,
and the digest is the same for the same bits whatever the device or the shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slime.wire.weight_digest import DIGEST_BLOCK, BlockSums, block_sums, block_sums_of, digests, fold, folded


def digest(tensor: torch.Tensor) -> str:
    return digests([tensor])[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.bool])
def test_every_single_bit_flip_changes_the_digest(dtype):
    tensor = (torch.randn(3, 7, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    reference = digest(tensor)
    raw = tensor.clone().reshape(-1).view(torch.uint8)
    for byte in range(raw.numel()):
        for bit in range(8):
            flipped = raw.clone()
            flipped[byte] ^= 1 << bit
            assert digest(flipped.view(tensor.dtype).reshape(tensor.shape)) != reference, (byte, bit)
        inverted = raw.clone()
        inverted[byte] ^= 0xFF
        assert digest(inverted.view(tensor.dtype).reshape(tensor.shape)) != reference, byte


def test_the_digest_sees_blocks_moved_and_only_bits():
    tensor = torch.randn(4 * DIGEST_BLOCK, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    moved = tensor.reshape(4, DIGEST_BLOCK).flip(0).reshape(-1)  # the same blocks in another order
    assert digest(moved) != digest(tensor)
    assert digest(tensor.reshape(64, -1)) == digest(tensor)  # the shape is not the digest's
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))
    assert digest(torch.zeros(0)) == digest(torch.zeros(5)) == "0000000000000000"  # zeros add nothing
    big = torch.randn(3 * DIGEST_BLOCK + 5, generator=torch.Generator().manual_seed(3))  # blocks and a partial one
    for position in (0, DIGEST_BLOCK - 1, DIGEST_BLOCK, 3 * DIGEST_BLOCK + 4):
        changed = big.clone()
        changed[position] = changed[position].nextafter(torch.tensor(1e9))
        assert digest(changed) != digest(big), position


def test_the_block_sums_are_the_exact_sums_of_the_bits_as_16_bit_halves():
    tensor = torch.randn(2 * DIGEST_BLOCK + 3, generator=torch.Generator().manual_seed(4))  # float32: 2 halves each
    halves = tensor.view(torch.int16).numpy().astype(np.int64)
    expected = [halves[i : i + DIGEST_BLOCK].sum() for i in range(0, halves.size, DIGEST_BLOCK)]
    assert block_sums(tensor).tolist() == expected
    h1 = sum(expected) % (2**31 - 1)
    h2 = sum(s % (2**31 - 19) * ((c * 1_000_000_007) % (2**31 - 20) + 1) for c, s in enumerate(expected)) % (2**31 - 19)
    short = fold(BlockSums(torch.from_numpy(block_sums(tensor[:7])), (1,)))[0]
    assert digests([tensor, tensor[:7]]) == [f"{h1:08x}{h2:08x}", short]
    extremes = torch.tensor([-(2**15), 2**15 - 1], dtype=torch.int16).repeat_interleave(DIGEST_BLOCK)
    assert block_sums(extremes).tolist() == [-(2**27), (2**15 - 1) * DIGEST_BLOCK]  # a block's sum is never wrapped


def test_block_sums_launched_apart_fold_to_each_tensors_digest():
    """`folded` over several launches (a push's buckets) gives each tensor the digest `digests` gives it alone,
    empty tensors and a one-byte dtype included."""
    gen = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=gen).to(dtype) for n, dtype in [(3, torch.float32), (9000, torch.bfloat16)]]
    tensors += [torch.zeros(0), torch.randint(0, 255, (5000,), generator=gen, dtype=torch.uint8)]
    launches = [block_sums_of(tensors[:2]), block_sums_of(tensors[2:3]), block_sums_of(tensors[3:])]
    assert [s.counts for s in launches] == [(1, 3), (0,), (2,)]
    assert folded(launches) == [digests([t])[0] for t in tensors] == digests(tensors)


@pytest.mark.parametrize("kernel", ["agrees", "differs", "fails", "missing"])
def test_the_triton_kernel_is_used_only_once_it_gave_torchs_block_sums(kernel, monkeypatch, caplog):
    """The CUDA path's guard (`_cuda_kernel`), run on the CPU with stand-ins for slime.wire.digest_kernel's kernel: one
    whose sums of the test tensors are torch's is used; one that differs, raises or is not installed is not (torch's
    reduction, and a warning that says why)."""
    from slime.wire import weight_digest

    def block_sums_cuda(xs, block):
        if kernel == "fails":
            raise RuntimeError("no such kernel here")
        sums = torch.cat([weight_digest._reduced(x) for x in xs])
        return sums if kernel == "agrees" else sums + 1

    monkeypatch.setattr(weight_digest, "block_sums_cuda", None if kernel == "missing" else block_sums_cuda)
    chosen = weight_digest._cuda_kernel.__wrapped__(torch.device("cpu"))
    assert (chosen is block_sums_cuda) == (kernel == "agrees")
    expected = {
        "agrees": "",
        "differs": "differ from torch's on a test tensor",
        "fails": "failed (RuntimeError: no such kernel here)",
        "missing": "are not installed (no Triton)",
    }[kernel]
    assert expected in caplog.text and (kernel == "agrees") == ("use torch's reduction" not in caplog.text)
