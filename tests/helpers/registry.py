"""A part registered for one test: a `slime.registry.Spec` added to its registry and removed when the test ends."""

from __future__ import annotations

from typing import Any

from slime.registry import Checks, Registry, Spec


def registered(monkeypatch, registry: Registry, name: str, target: Any, *, facts=None, checks=None) -> Spec:
    """Register `name` (an absolute `target`, `facts`, `checks`) in `registry` until the test ends."""
    spec = Spec(seam=registry.key, name=name, target=target, facts=facts, checks=checks or Checks())
    monkeypatch.setitem(registry._added, name, spec)
    return spec
