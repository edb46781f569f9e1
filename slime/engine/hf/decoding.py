"""How the built-in engine decodes, as the plan sizes it and its check refuses what it cannot do (torch-free)."""

from __future__ import annotations

from slime.config.schema import RunConfig


def hf_batches(cfg: RunConfig) -> bool:
    """Whether the hf engine may decode requests together (slime/plan/derive.py sizes its batches by it): always,
    except under rollout.deterministic, whose batch-invariant forward passes (slime/engine/hf/batch_invariant.py)
    run on the CPU with one torch thread only; elsewhere a deterministic run decodes each request alone."""
    r = cfg.rollout
    return not r.deterministic or (cfg.cluster.device == "cpu" and r.hf.num_threads == 1)
