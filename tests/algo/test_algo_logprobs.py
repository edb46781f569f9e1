"""Tests for slime.algo.logprobs (docs/algorithms.md#log-probs-and-the-reuse-rule)."""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.logprobs import log_probs_and_entropy, response_logits_slice

D = torch.float64


def _ref_row(row, target, temp):
    z = [x / temp for x in row]
    lse = math.log(sum(math.exp(v) for v in z))
    p = [math.exp(v - lse) for v in z]
    return z[target] - lse, -sum(pi * math.log(pi) for pi in p)


def test_log_probs_and_entropy_by_hand():
    rows = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-4.0, 0.5, 2.0]]
    targets = [2, 1, 0]
    lp, ent = log_probs_and_entropy(
        torch.tensor(rows, dtype=D), torch.tensor(targets), temperature=2.0, with_entropy=True
    )
    ref = [_ref_row(r, k, 2.0) for r, k in zip(rows, targets)]
    assert lp.dtype == D and ent.dtype == D
    assert_close(lp, torch.tensor([a for a, _ in ref], dtype=D), rtol=0, atol=1e-14)
    assert_close(ent, torch.tensor([b for _, b in ref], dtype=D), rtol=0, atol=1e-14)
    # row 0 written out: z = [0.5, 1, 1.5]; row 1 uniform -> lp = -log 3, H = log 3
    row0 = 1.5 - math.log(math.exp(0.5) + math.exp(1) + math.exp(1.5))
    assert_close(lp[0], torch.tensor(row0, dtype=D), rtol=0, atol=1e-14)
    assert_close(lp[1], torch.tensor(-math.log(3), dtype=D), rtol=0, atol=1e-14)
    assert_close(ent[1], torch.tensor(math.log(3), dtype=D), rtol=0, atol=1e-14)


def test_without_entropy_returns_none():
    lp, ent = log_probs_and_entropy(
        torch.zeros(2, 4, dtype=D), torch.tensor([0, 3]), temperature=1.0, with_entropy=False
    )
    assert ent is None
    assert_close(lp, torch.full((2,), -math.log(4), dtype=D), rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_upcast_to_fp32(dtype):
    rows = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]  # exactly representable in half types
    lp, ent = log_probs_and_entropy(
        torch.tensor(rows, dtype=dtype), torch.tensor([2, 1]), temperature=0.5, with_entropy=True
    )
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    ref = [_ref_row(r, k, 0.5) for r, k in zip(rows, [2, 1])]
    assert_close(lp.double(), torch.tensor([a for a, _ in ref], dtype=D), rtol=0, atol=1e-6)
    assert_close(ent.double(), torch.tensor([b for _, b in ref], dtype=D), rtol=0, atol=1e-6)


def test_gradient_of_log_prob_is_onehot_minus_softmax_over_t():
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=D, requires_grad=True)
    lp, _ = log_probs_and_entropy(logits, torch.tensor([0]), temperature=2.0, with_entropy=False)
    lp.sum().backward()
    z = [0.5, 1.0, 1.5]
    lse = math.log(sum(math.exp(v) for v in z))
    p = [math.exp(v - lse) for v in z]
    assert_close(logits.grad, torch.tensor([[(1 - p[0]) / 2, -p[1] / 2, -p[2] / 2]], dtype=D), rtol=0, atol=1e-14)


def test_response_logits_slice_alignment():
    assert response_logits_slice(5, 3) == slice(4, 7)
    # tokens: prompt [7, 3, 5], response [1, 2]; logits row i peaks (value 10) at tokens[i + 1]
    tokens = torch.tensor([7, 3, 5, 1, 2])
    logits = torch.zeros(5, 8, dtype=D)
    for i in range(4):
        logits[i, tokens[i + 1]] = 10.0
    sl = response_logits_slice(3, 2)
    lp, _ = log_probs_and_entropy(logits[sl], tokens[3:5], temperature=1.0, with_entropy=False)
    # peaked row: 10 - log(e^10 + 7)
    assert_close(lp, torch.full((2,), 10 - math.log(math.exp(10) + 7), dtype=D), rtol=0, atol=1e-14)


def test_bad_arguments():
    with pytest.raises(ValueError):
        response_logits_slice(0, 3)
    with pytest.raises(ValueError):
        log_probs_and_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), temperature=0.0, with_entropy=False)
