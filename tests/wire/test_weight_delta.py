"""Bitwise deltas and checksums (slime.wire.weight_delta): a delta rebuilds the new tensor bit for bit from the old
(NaN payloads and signed zeros too) and carries only the changed elements; the checksum changes with every single
bit flipped anywhere in a tensor, and with two values swapped."""

from __future__ import annotations

import pytest
import torch

from slime.wire.weight_delta import apply_delta, bits, changed_fraction, delta_of


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_gap_delta_rebuilds_the_new_tensor_bit_for_bit_with_far_apart_changes(dtype):
    from slime.wire.weight_delta import MAX_GAP, apply_gap_delta, gap_delta

    old = torch.randn(3 * MAX_GAP + 100, generator=torch.Generator().manual_seed(5)).to(dtype)
    new = old.clone()
    for position in (0, 7, 8, 2 * MAX_GAP + 50, 3 * MAX_GAP + 99):  # gaps of 0, 1, ~2 MAX_GAP and more
        new[position] = -new[position] + 1
    gaps, values = gap_delta(old, new)
    assert gaps.dtype == torch.int16 and values.dtype == bits(new).dtype
    assert 5 < gaps.numel() <= 8  # the changes and the few unchanged elements that keep each step in 16 bits
    rebuilt = apply_gap_delta(old.clone(), gaps, values)
    assert torch.equal(bits(rebuilt), bits(new))
    nothing = gap_delta(old, old.clone())
    assert nothing[0].numel() == 0 and torch.equal(bits(apply_gap_delta(old.clone(), *nothing)), bits(old))
    strided = old[:196700].clone().reshape(-1, 100)[:, :50]  # not contiguous: applied through a copy
    target = old[:196700].clone().reshape(-1, 100)[:, :50]
    changed = strided.clone()
    changed[3, 4] = 9
    apply_gap_delta(target, *gap_delta(strided.contiguous(), changed.contiguous()))
    assert torch.equal(target, changed)
