"""The derived values of a run (`Derived`: GPU counts, batch sizes, the rollout function), computed here only."""

from __future__ import annotations

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
from slime.config.schema import RunConfig, resolved_precision
from slime.engine.groups import rollout_gpu_count
from slime.engine.hf.decoding import hf_batches
from slime.rollout.entry_points import rollout_function_path
from slime.rollout.run_length import rollouts_for_epochs

HF_DEFAULT_MAX_BATCH_SIZE = 256


def critic_gpus(cfg: RunConfig) -> int:
    """GPUs of the critic's own group: 0 when the estimator trains no critic (or an unknown one, reported by
    validation) or the critic shares the actor's GPUs."""
    c, estimator = cfg.cluster, ESTIMATORS.find(cfg.algo.advantage_estimator)
    if estimator is None or not estimator.needs_critic or c.critic.colocate_with_actor:
        return 0
    nodes = c.critic.num_nodes if c.critic.num_nodes is not None else c.actor.num_nodes
    per_node = c.critic.num_gpus_per_node if c.critic.num_gpus_per_node is not None else c.actor.num_gpus_per_node
    return nodes * per_node


def derive(cfg: RunConfig) -> Derived:
    """Compute the derived values; tolerant of invalid configs (validation reports those)."""
    c, r, t, p = cfg.cluster, cfg.rollout, cfg.train, cfg.parallelism
    actor = c.actor.num_nodes * c.actor.num_gpus_per_node
    critic = critic_gpus(cfg)
    rollout = rollout_gpu_count(cfg)
    total = max(actor + critic, rollout) if c.colocate else actor + critic + rollout
    model_parallel = max(p.tp * p.pp * p.cp, 1)
    dp = max(actor // model_parallel, 1)
    samples = r.batch_size * r.n_samples_per_prompt
    k = max(t.num_steps_per_rollout, 1)
    g = t.global_batch_size if t.global_batch_size is not None else samples // k
    num_rollout = rollouts_for_epochs(cfg)
    precision = resolved_precision(t.precision, c.device)
    return Derived(
        actor_gpus=actor,
        critic_gpus=critic,
        rollout_gpus=rollout,
        total_gpus=total,
        dp_size=dp,
        samples_per_rollout=samples,
        global_batch_size=g,
        samples_per_dp_rank=g // dp,
        num_rollout=num_rollout,
        num_optimizer_steps=(num_rollout or 0) * k,
        over_sampling_batch_size=r.over_sampling_batch_size or r.batch_size,
        hf_max_batch_size=r.hf.max_batch_size or (HF_DEFAULT_MAX_BATCH_SIZE if hf_batches(cfg) else 1),
        precision=precision,
        rollout_function=rollout_function_path(cfg),
    )
