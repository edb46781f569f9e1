"""Faults planted in a weight push between the trainer's record of each tensor (`PushLedger.watch`, slime.sync.verify)
and the engines' load: what any mode's transport could do to a bucket after the trainer hashed it."""

from __future__ import annotations

import contextlib

from slime.sync.push_ledger import PushLedger
from slime.sync.verify import flipped


@contextlib.contextmanager
def planted(monkeypatch, *, flip: str | None = None, drop: str | None = None):
    """While open, every push's bucket holding tensor `flip` carries it with one byte flipped, and the one holding
    `drop` carries it not at all, after the trainer recorded both."""
    watch = PushLedger.watch

    def faulty(self, buckets):
        for bucket in watch(self, buckets):
            bucket = [(n, flipped(t, 7) if n == flip else t) for n, t in bucket if n != drop]
            yield bucket

    with monkeypatch.context() as patch:
        patch.setattr(PushLedger, "watch", faulty)
        yield
