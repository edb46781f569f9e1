"""Unbiased pass@k estimator (docs/data-and-rewards.md#eval)."""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k = 1 − C(n−c, k)/C(n, k) for one prompt with n samples, c of them correct.

    Stable product form 1 − Π_{i=n−c+1..n} (1 − k/i); 1.0 when n − c < k.
    Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod
