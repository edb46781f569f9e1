"""Per-request sampling seeds of rollout.deterministic: a pure function of (run seed, sample, progress)."""

from __future__ import annotations

from slime.rollout.generate import request_seed
from slime.types import Sample


def test_request_seed_is_stable_distinct_and_in_range():
    sample = Sample(index=7)
    seed = request_seed(1234, sample)
    assert seed == request_seed(1234, Sample(index=7, prompt="another object, same index"))
    assert seed == 559_540_074  # fixed across processes and Python versions (no hash() salt)
    seeds = {request_seed(base, Sample(index=i)) for base in (1, 2) for i in range(1000)}
    assert len(seeds) == 2000 and all(0 <= s < 2**31 for s in seeds)
    sample.response_length = 3  # a continued (partial) sample draws fresh randomness
    assert request_seed(1234, sample) != seed
