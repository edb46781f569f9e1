"""Validation of the built-in hf engine's config: the checks of its registry record (slime.registry.ENGINES),
run by slime/plan/validate.py before anything starts. No torch or transformers at import."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.engine.check import SGLANG_ROUTER, check_generating_health_timeout, check_router_args
from slime.engine.groups import WORKER_TYPES, group_overrides
from slime.engine.hf.decoding import hf_batches
from slime.engine.sglang.check import unused_server_args


def check(cfg: RunConfig) -> Iterator[Problem]:
    """rollout.engine=hf: one device; under rollout.deterministic, batches only where its batch-invariant forward
    passes run (`hf_batches`: the CPU, one torch thread); it speaks SGLang's protocol behind sglang-router, so the
    router and health-probe rules are SGLang's, and server-group overrides (SGLang server args) do nothing."""
    c = cfg.cluster
    if (cfg.rollout.hf.max_batch_size or 1) > 1 and not hf_batches(cfg):
        yield Problem(
            "rollout.hf.max_batch_size",
            cfg.rollout.hf.max_batch_size,
            "with rollout.deterministic=true the hf engine batches requests (batch-invariant) on the CPU with "
            f"rollout.hf.num_threads=1 only, not cluster.device={c.device} with {cfg.rollout.hf.num_threads} threads",
            "set rollout.hf.max_batch_size=null (each request decoded on its own), rollout.hf.num_threads=1 on the "
            "CPU, or rollout.deterministic=false",
        )
    if c.rollout.num_gpus_per_engine != 1:
        yield Problem(
            "cluster.rollout.num_gpus_per_engine",
            c.rollout.num_gpus_per_engine,
            "the built-in hf engine runs on one device",
            "set cluster.rollout.num_gpus_per_engine=1",
        )
    yield from _check_no_disaggregation(cfg)
    yield from unused_server_args(cfg, group_overrides(cfg))
    yield from check_router_args(cfg, SGLANG_ROUTER)
    yield from check_generating_health_timeout(cfg)


def _check_no_disaggregation(cfg: RunConfig) -> Iterator[Problem]:
    """The built-in engine serves regular groups only: prefill/decode disaggregation needs SGLang or vLLM."""
    for i, model in enumerate(cfg.rollout.models):
        for j, group in enumerate(model.server_groups):
            if group.worker_type != "regular" and group.worker_type in WORKER_TYPES:
                yield Problem(
                    f"rollout.models[{i}].server_groups[{j}].worker_type",
                    group.worker_type,
                    f"PD disaggregation needs SGLang or vLLM servers, not rollout.engine={cfg.rollout.engine}",
                    "use rollout=sglang or rollout=vllm, or worker_type: regular",
                )
