"""The log-prob probe after a verified push (`rollout.weight_sync.verify`, `probe_tokens`; docs/engines.md#the-log-prob-probe).

The digests (slime.sync.verify) prove that the engines hold the bytes the trainer pushed; the probe proves that they
compute with them what the trainer computes: each engine generates a fixed prompt (slime.rollout.probe), and the
trainer scores the tokens it sampled on the weights it pushed. An engine whose mean log-prob differs by more than the
tolerance of the run's precision serves another model than the trainer's: a head it never reloaded, a layer its
kernels repacked from an older copy (no digest reaches those on a CPU vLLM), a layout read the wrong way, weights
loaded into the wrong dtype. The pair compared is the one `train/train_rollout_logprob_abs_diff` compares every step
(measured about 3e-7 in fp32 on CPU, 1e-2 in bf16 on GPU), so the tolerances stand far above agreement and far below
a wrong model.
"""

from __future__ import annotations

import dataclasses
import statistics

from slime.config.problems import get
from slime.config.schema import resolved_precision
from slime.registry import ENGINES
from slime.sync.verify import WeightMismatchError

# mean |engine - trainer| log-prob over the probe's tokens, by the coarser of the trainer's and the engines' precision
TOLERANCE = {"fp32": 1e-3, "bf16": 0.1}


@dataclasses.dataclass(frozen=True)
class EngineProbe:
    """One engine's answer to the probe: the token ids it sampled and its log-prob of each."""

    url: str
    tokens: list[int]
    log_probs: list[float]


def probe_precision(trainer_precision: str, engine_dtype: str, device: str) -> str:
    """ "bf16" when either side computes in bf16 (`resolved_precision`: auto is bf16 on cuda), else "fp32"."""
    sides = {resolved_precision(trainer_precision, device), resolved_precision(engine_dtype, device)}
    return "bf16" if "bf16" in sides else "fp32"


def probe_tolerance(cfg) -> float:
    """`rollout.weight_sync.probe_tolerance`, or by precision: the trainer's (`train.precision`) and the engines': the
    built-in engine's `rollout.hf.dtype` (its `EngineFacts.dtype_key`); another engine's is the trainer's (its launch
    dtype, slime.driver.rollout_setup)."""
    if cfg.rollout.weight_sync.probe_tolerance is not None:
        return cfg.rollout.weight_sync.probe_tolerance
    dtype_key = ENGINES.facts(cfg.rollout.engine).dtype_key
    engine_dtype = get(cfg.rollout, dtype_key) if dtype_key else cfg.train.precision
    return TOLERANCE[probe_precision(cfg.train.precision, engine_dtype, cfg.cluster.device)]


def check_probe(
    answers: list[EngineProbe], trainer: list[list[float]], *, tolerance: float, version: int
) -> dict[str, float]:
    """Compare each engine's log-probs with the trainer's of the same tokens (`trainer[i]` for `answers[i]`).

    Returns `rollout/weight_probe_logprob_diff` (the largest engine mean) and `_max` (the largest token's);
    raises WeightMismatchError naming every engine whose mean exceeds `tolerance`, with its figures."""
    means, peaks, wrong, urls = [], [], [], []
    for answer, scored in zip(answers, trainer, strict=True):
        if len(scored) != len(answer.log_probs):
            raise RuntimeError(
                f"the probe of {answer.url}: the trainer scored {len(scored)} tokens of {len(answer.log_probs)}"
            )
        if not scored:
            continue
        gaps = [abs(e - t) for e, t in zip(answer.log_probs, scored)]
        mean, worst = statistics.fmean(gaps), max(range(len(gaps)), key=gaps.__getitem__)
        means.append(mean)
        peaks.append(gaps[worst])
        if not mean <= tolerance:  # NaN is wrong too
            urls.append(answer.url)
            wrong.append(
                f"engine {answer.url}: mean |log-prob difference| {mean:.3g} over {len(gaps)} tokens (tolerance "
                f"{tolerance:g}); token {worst} (id {answer.tokens[worst]}): engine {answer.log_probs[worst]:.4f}, "
                f"trainer {scored[worst]:.4f}"
            )
    if wrong:
        raise WeightMismatchError(
            f"the log-prob probe after the push of version {version}: the engines compute other log-probs than the "
            f"trainer on the weights it pushed: {'; '.join(wrong)}",
            urls,
        )
    if not means:
        return {}
    return {"rollout/weight_probe_logprob_diff": max(means), "rollout/weight_probe_logprob_diff_max": max(peaks)}
