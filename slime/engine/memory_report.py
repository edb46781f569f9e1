"""The engines' memory as a rollout step logs it: `perf/engine_gib/<part>`, each part the largest over the engines."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from slime.engine.client import EngineClient, largest_parts
from slime.engine.http_client import EngineHTTPError

logger = logging.getLogger(__name__)


def engine_memory_metrics(clients: Iterable[EngineClient]) -> dict[str, float]:
    """`{"perf/engine_gib/<part>": GiB}` from each engine's report (`EngineClient.memory_gib`); an engine that does
    not answer is left out (its health is the probes' and the next control call's)."""
    parts = largest_parts(_report(client) for client in clients)
    return {f"perf/engine_gib/{part}": gib for part, gib in parts.items()}


def _report(client: EngineClient) -> dict[str, float]:
    try:
        return client.memory_gib()
    except EngineHTTPError as exc:
        logger.warning("no memory report from %s: %s", client.url, exc)
        return {}
