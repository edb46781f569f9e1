"""Bitwise deltas and checksums (slime.wire.weight_delta): a delta rebuilds the new tensor bit for bit from the old
(NaN payloads and signed zeros too) and carries only the changed elements; the checksum changes with every single
bit flipped anywhere in a tensor, and with two values swapped."""

from __future__ import annotations

import pytest
import torch

from slime.wire.weight_delta import apply_delta, bit_checksum, bits, changed_fraction, delta_of


def exported_after_a_small_step(dtype: torch.dtype, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(before, after): fp32 master weights of a trained layer's scale exported to `dtype`, then nudged by one
    Adam-sized step of `lr` (every element moves by about lr) and exported again."""
    generator = torch.Generator().manual_seed(0)
    master = torch.randn(256, 512, generator=generator) * 0.02
    step = torch.randn(master.shape, generator=generator).sign() * lr
    return master.to(dtype), (master - step).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_a_delta_rebuilds_the_new_tensor_bit_for_bit(dtype):
    old, new = exported_after_a_small_step(dtype, lr=1e-6)
    flat_new = new.reshape(-1)
    flat_new[:4] = torch.tensor([float("nan"), -0.0, 0.0, float("inf")], dtype=dtype)  # bits a float compare loses
    delta = delta_of(old, new)
    rebuilt = apply_delta(old.clone(), delta)
    assert torch.equal(bits(rebuilt), bits(new))
    assert delta.positions.numel() == int((bits(old) != bits(new)).sum())


def test_after_an_lr_1e_6_step_a_bf16_delta_carries_a_few_percent_of_the_bytes():
    """bf16 keeps 8 bits of mantissa: a step of 1e-6 on weights of 0.02 crosses a rounding boundary for about one
    element in a hundred (the fp32 master moves, its bf16 copy mostly does not)."""
    old, new = exported_after_a_small_step(torch.bfloat16, lr=1e-6)
    fraction = changed_fraction(old, new)
    assert 0.001 < fraction < 0.05
    delta = delta_of(old, new)
    assert delta.nbytes == delta.positions.numel() * (4 + 2)
    assert delta.nbytes < 0.15 * old.numel() * old.element_size()
    assert changed_fraction(old, old.clone()) == 0.0 and delta_of(old, old.clone()).nbytes == 0


def test_a_delta_refuses_tensors_of_another_shape_or_dtype():
    with pytest.raises(ValueError, match="equal shapes and dtypes"):
        delta_of(torch.zeros(4), torch.zeros(5))
    with pytest.raises(ValueError, match="equal shapes and dtypes"):
        delta_of(torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.bool])
def test_every_single_bit_flip_changes_the_checksum(dtype):
    tensor = (torch.randn(3, 7, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    reference = bit_checksum(tensor)
    raw = tensor.clone().reshape(-1).view(torch.uint8)
    seen = {reference}
    for byte in range(raw.numel()):
        for bit in range(8):
            flipped = raw.clone()
            flipped[byte] ^= 1 << bit
            checksum = bit_checksum(flipped.view(tensor.dtype).reshape(tensor.shape))
            assert checksum != reference, (byte, bit)
            seen.add(checksum)
    assert len(seen) == raw.numel() * 8 + 1  # every flip gives a checksum of its own


def test_the_checksum_sees_values_moved_and_only_bits():
    tensor = torch.arange(1, 65, dtype=torch.float32)
    swapped = tensor.clone()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert bit_checksum(swapped) != bit_checksum(tensor)
    assert bit_checksum(tensor.reshape(8, 8)) == bit_checksum(tensor)  # the shape is not the checksum's
    assert bit_checksum(tensor.reshape(8, 8).t()) != bit_checksum(tensor)  # the element order is
    assert bit_checksum(torch.tensor([0.0])) != bit_checksum(torch.tensor([-0.0]))
    assert 0 <= bit_checksum(torch.full((10,), -1.0)) < 2**64
    assert bit_checksum(torch.zeros(0)) == 0 == bit_checksum(torch.zeros(5))  # zeros (and padding) add nothing
    big = torch.randn(3 * 2**16 + 5, generator=torch.Generator().manual_seed(2))  # blocks, and a partial one
    for position in (0, 2**16 - 1, 2**16, 3 * 2**16 + 4):
        changed = big.clone()
        changed[position] = changed[position].nextafter(torch.tensor(1e9))
        assert bit_checksum(changed) != bit_checksum(big), position
