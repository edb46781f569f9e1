"""Tests for slime.algo.passk (docs/data-and-rewards.md#eval)."""

import math

import pytest

from slime.algo.passk import pass_at_k


def test_reference_examples():
    assert pass_at_k(4, 1, 1) == pytest.approx(1 - 3 / 4, abs=1e-12)  # 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (1 - 2 / 4), abs=1e-12)  # 0.5
    assert pass_at_k(4, 1, 4) == 1.0  # n - c = 3 < 4
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - (1 - 2 / 3) * (1 - 2 / 4), abs=1e-12)
    assert pass_at_k(4, 2, 2) == pytest.approx(0.8333333, abs=1e-7)
    assert pass_at_k(8, 3, 4) == pytest.approx(1 - 1 / 14, abs=1e-12)  # (1/3)(3/7)(1/2) = 1/14
    assert pass_at_k(8, 3, 4) == pytest.approx(0.9285714, abs=1e-7)


def test_matches_binomial_form():
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_edges():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)
