"""Cross-field validation: every rule runs before Ray starts and all problems are reported at once.

Each problem names the key, its value, what is wrong and the override that fixes it. `main.py`
turns a `ConfigError` into exit status 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

from slime.config.derive import Derived, derive
from slime.config.hooks import load_callable
from slime.config.schema import RUN_PHASES, RunConfig

BACKENDS = ("fsdp",)  # megatron arrives with its own issue
ENGINES = ("hf",)  # sglang arrives with its own issue
ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo", "sft")
KL_IN_REWARD = ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
TIS_MODES = ("truncate", "icepop")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
DEVICES = ("cpu", "cuda")
LR_DECAY_STYLES = ("constant", "linear", "cosine")
PRECISIONS = ("auto", "fp32", "bf16")
WANDB_MODES = ("online", "offline", "disabled", "auto")
SIGNALS = ("SIGINT", "SIGTERM")


@dataclasses.dataclass(frozen=True)
class Problem:
    key: str
    value: Any
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.message}. Fix: {self.fix}"


class ConfigError(ValueError):
    """One or more configuration problems, found before any resource was allocated."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration ({len(problems)} problem{'s' * (len(problems) > 1)}):\n{lines}")


def _one_of(key: str, value: Any, allowed: tuple) -> Iterator[Problem]:
    if value not in allowed:
        yield Problem(key, value, f"must be one of {list(allowed)}", f"set {key}=<one of {', '.join(map(str, allowed))}>")


def _positive(cfg: RunConfig, *keys: str) -> Iterator[Problem]:
    for key in keys:
        value = _get(cfg, key)
        if value is not None and value <= 0:
            yield Problem(key, value, "must be > 0", f"set {key} to a positive number")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_choices(cfg: RunConfig) -> Iterator[Problem]:
    yield from _one_of("parallelism.backend", cfg.parallelism.backend, BACKENDS)
    yield from _one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    yield from _one_of("algo.advantage_estimator", cfg.algo.advantage_estimator, ADVANTAGE_ESTIMATORS)
    yield from _one_of("algo.kl_loss_type", cfg.algo.kl_loss_type, KL_TYPES)
    yield from _one_of("algo.tis_mode", cfg.algo.tis_mode, TIS_MODES)
    yield from _one_of("cluster.device", cfg.cluster.device, DEVICES)
    yield from _one_of("train.lr_decay_style", cfg.train.lr_decay_style, LR_DECAY_STYLES)
    yield from _one_of("train.precision", cfg.train.precision, PRECISIONS)
    yield from _one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)


def check_debug(cfg: RunConfig) -> Iterator[Problem]:
    d = cfg.debug
    yield from _one_of("debug.signal", d.signal, SIGNALS)
    if d.signal_delay_s < 0:
        yield Problem("debug.signal_delay_s", d.signal_delay_s, "must be >= 0", "set debug.signal_delay_s=0")
    if d.signal_at is not None:
        phase, _, rollout_id = d.signal_at.partition(":")
        if phase not in RUN_PHASES or (rollout_id and not rollout_id.lstrip("-").isdigit()):
            yield Problem("debug.signal_at", d.signal_at, f"must be PHASE or PHASE:ROLLOUT_ID with PHASE one of "
                          f"{list(RUN_PHASES)}", "set debug.signal_at=rollout:1, or null")


def check_ranges(cfg: RunConfig) -> Iterator[Problem]:
    yield from _positive(
        cfg,
        "rollout.batch_size", "rollout.n_samples_per_prompt", "rollout.max_response_len", "rollout.concurrency",
        "train.num_rollout", "train.num_steps_per_rollout", "train.lr", "parallelism.micro_batch_size",
        "rollout.hf.max_batch_size", "eval.n_samples_per_prompt",
    )
    if cfg.rollout.temperature <= 0:
        yield Problem(
            "rollout.temperature", cfg.rollout.temperature,
            "must be > 0 (log-probs are taken from logits / temperature)", "set rollout.temperature=1.0",
        )
    if not 0 < cfg.rollout.top_p <= 1:
        yield Problem("rollout.top_p", cfg.rollout.top_p, "must be in (0, 1]", "set rollout.top_p=1.0")
    if cfg.train.clip_grad < 0:
        yield Problem("train.clip_grad", cfg.train.clip_grad, "must be >= 0 (0 disables clipping)", "set train.clip_grad=1.0")
    if cfg.eval.temperature is not None and cfg.eval.temperature <= 0:
        yield Problem("eval.temperature", cfg.eval.temperature, "must be > 0", "set eval.temperature=0.1 or null")
    if cfg.rollout.over_sampling_batch_size is not None and cfg.rollout.over_sampling_batch_size < cfg.rollout.batch_size:
        yield Problem(
            "rollout.over_sampling_batch_size", cfg.rollout.over_sampling_batch_size,
            f"must be >= rollout.batch_size={cfg.rollout.batch_size}", "set it to null (= rollout.batch_size) or larger",
        )


def check_batch_arithmetic(cfg: RunConfig) -> Iterator[Problem]:
    """B_p·n = G·K (REFERENCE.md §1), and G splits evenly over data-parallel ranks."""
    r, t = cfg.rollout, cfg.train
    if min(r.batch_size, r.n_samples_per_prompt, t.num_steps_per_rollout) <= 0:
        return  # reported by check_ranges
    samples = r.batch_size * r.n_samples_per_prompt
    k = t.num_steps_per_rollout
    if t.global_batch_size is None:
        if samples % k:
            yield Problem(
                "train.num_steps_per_rollout", k,
                f"rollout.batch_size × rollout.n_samples_per_prompt = {r.batch_size} × {r.n_samples_per_prompt} = "
                f"{samples} samples do not split into {k} equal optimizer steps",
                f"pick train.num_steps_per_rollout dividing {samples}",
            )
        return
    g = t.global_batch_size
    if g * k != samples:
        suggestion = f"train.global_batch_size={samples // k}" if samples % k == 0 else "train.global_batch_size=null"
        yield Problem(
            "train.global_batch_size", g,
            f"rollout.batch_size × rollout.n_samples_per_prompt = {r.batch_size} × {r.n_samples_per_prompt} = {samples} "
            f"must equal train.global_batch_size × train.num_steps_per_rollout = {g} × {k} = {g * k}",
            f"set {suggestion} (or change rollout.batch_size / train.num_steps_per_rollout)",
        )


def check_cluster(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """GPU arithmetic: every role's devices fit the cluster and split into engines and DP ranks."""
    c = cfg.cluster
    for key in ("cluster.num_nodes", "cluster.num_gpus_per_node", "cluster.actor.num_nodes",
                "cluster.actor.num_gpus_per_node", "cluster.rollout.num_gpus_per_engine"):
        if _get(cfg, key) < 1:
            yield Problem(key, _get(cfg, key), "must be >= 1", f"set {key}=1 or more")
    if c.actor.num_nodes > c.num_nodes:
        yield Problem("cluster.actor.num_nodes", c.actor.num_nodes, f"the cluster has {c.num_nodes} node(s)",
                      f"set cluster.actor.num_nodes<={c.num_nodes} or cluster.num_nodes")
    if c.actor.num_gpus_per_node > c.num_gpus_per_node:
        yield Problem("cluster.actor.num_gpus_per_node", c.actor.num_gpus_per_node,
                      f"a node has {c.num_gpus_per_node} GPU(s) (cluster.num_gpus_per_node)",
                      f"set cluster.actor.num_gpus_per_node<={c.num_gpus_per_node}")
    if c.rollout.num_gpus_per_engine >= 1 and derived.rollout_gpus % c.rollout.num_gpus_per_engine:
        yield Problem("cluster.rollout.num_gpus", derived.rollout_gpus,
                      f"not a multiple of cluster.rollout.num_gpus_per_engine={c.rollout.num_gpus_per_engine}",
                      "make cluster.rollout.num_gpus a multiple of num_gpus_per_engine")
    if derived.num_engines < 1 and c.rollout.num_gpus_per_engine >= 1:
        yield Problem("cluster.rollout.num_gpus", c.rollout.num_gpus, "no rollout engine fits",
                      f"set cluster.rollout.num_gpus>={c.rollout.num_gpus_per_engine}")
    capacity = c.num_nodes * c.num_gpus_per_node
    if derived.total_gpus > capacity:
        yield Problem(
            "cluster.actor.num_gpus_per_node", c.actor.num_gpus_per_node,
            f"the run needs {derived.total_gpus} GPU(s) (actor {derived.actor_gpus} + critic {derived.critic_gpus}"
            f" + rollout {0 if c.colocate else derived.rollout_gpus}{', colocated' if c.colocate else ''}) "
            f"but the cluster has {c.num_nodes} × {c.num_gpus_per_node} = {capacity}",
            "lower cluster.actor.num_gpus_per_node / cluster.rollout.num_gpus, set cluster.colocate=true, "
            "or pick a larger cluster=...",
        )
    yield from check_critic_resources(cfg, derived)
    g = cfg.train.global_batch_size
    if g is not None and derived.dp_size >= 1 and g % derived.dp_size:
        yield Problem("train.global_batch_size", g, f"must split evenly over {derived.dp_size} data-parallel ranks",
                      f"use a multiple of {derived.dp_size}")
    if c.device == "cuda" and c.ray_address is None:
        local = _local_cuda_count()
        if local < min(derived.total_gpus, c.num_gpus_per_node):
            yield Problem("cluster.device", c.device, f"this machine has {local} CUDA device(s) and no Ray cluster was given",
                          "set cluster=local_cpu, or cluster.ray_address=<head address> to join a GPU cluster")


def check_parts_honour_options(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """Options the chosen backend and engine cannot honour are rejected, not ignored."""
    c, p = cfg.cluster, cfg.parallelism
    model_parallel = p.tp * p.pp * p.cp
    if derived.actor_gpus % model_parallel:
        yield Problem("parallelism.tp", p.tp, f"actor GPUs ({derived.actor_gpus}) are not divisible by tp·pp·cp = {model_parallel}",
                      "choose tp, pp, cp whose product divides the actor GPU count")
    if p.backend == "fsdp":
        for key in ("pp", "cp", "ep", "etp"):
            if getattr(p, key) != 1:
                yield Problem(f"parallelism.{key}", getattr(p, key), "the fsdp backend splits models by data and "
                              "tensor parallelism only", f"set parallelism.{key}=1 or parallelism=megatron")
        m = cfg.model
        for key in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
            if p.tp > 1 and getattr(m, key) % p.tp:
                yield Problem("parallelism.tp", p.tp, f"tensor parallelism splits model.{key}={getattr(m, key)} "
                              "evenly over the tp ranks", f"pick a parallelism.tp dividing {getattr(m, key)}")
        if p.sequence_parallel:
            yield Problem("parallelism.sequence_parallel", True, "sequence parallelism needs tensor parallelism (megatron)",
                          "set parallelism.sequence_parallel=false")
        if p.megatron:
            yield Problem("parallelism.megatron", dict(p.megatron), "megatron-core fields do nothing with the fsdp backend",
                          "remove them or set parallelism.backend=megatron")
    if cfg.rollout.engine == "hf":
        if cfg.rollout.deterministic and (cfg.rollout.hf.max_batch_size or 1) > 1:
            yield Problem(
                "rollout.hf.max_batch_size", cfg.rollout.hf.max_batch_size,
                "with rollout.deterministic=true the hf engine decodes each request on its own (batch-invariant)",
                "set rollout.hf.max_batch_size=null, or rollout.deterministic=false to batch requests",
            )
        if c.rollout.num_gpus_per_engine != 1:
            yield Problem("cluster.rollout.num_gpus_per_engine", c.rollout.num_gpus_per_engine,
                          "the built-in hf engine runs on one device", "set cluster.rollout.num_gpus_per_engine=1")
        if cfg.rollout.sglang:
            yield Problem("rollout.sglang", dict(cfg.rollout.sglang), "SGLang server args do nothing with rollout.engine=hf",
                          "remove them or use the sglang engine")


def check_critic_resources(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    c = cfg.cluster.critic
    if cfg.algo.advantage_estimator != "ppo":
        if c.num_gpus_per_node:
            yield Problem("cluster.critic.num_gpus_per_node", c.num_gpus_per_node,
                          f"only ppo trains a critic; algo.advantage_estimator={cfg.algo.advantage_estimator!r} would leave "
                          "these GPUs idle", "set cluster.critic.num_gpus_per_node=null")
        return
    if not c.colocate_with_actor and derived.critic_gpus == 0:
        yield Problem("cluster.critic.num_gpus_per_node", c.num_gpus_per_node, "ppo needs a critic but it has no GPUs",
                      "set cluster.critic.num_gpus_per_node=null (as many as the actor) or "
                      "cluster.critic.colocate_with_actor=true")
    elif derived.critic_gpus and derived.critic_gpus != derived.actor_gpus:
        yield Problem("cluster.critic.num_gpus_per_node", c.num_gpus_per_node,
                      f"the critic must mirror the actor's {derived.actor_gpus} GPU(s) (same data-parallel layout)",
                      "set cluster.critic.num_nodes/num_gpus_per_node=null")


def _local_cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: treat as no GPU
        return 0


def check_algo(cfg: RunConfig) -> Iterator[Problem]:
    a = cfg.algo
    if a.use_kl_loss and cfg.checkpoint.ref_load is None:
        yield Problem("algo.use_kl_loss", True, "the KL loss needs a reference model but checkpoint.ref_load is null",
                      "set checkpoint.ref_load=<HF dir of the reference model> (e.g. ${model.hf_checkpoint}) "
                      "or algo.use_kl_loss=false")
    if a.use_kl_loss and a.kl_coef != 0:
        yield Problem("algo.kl_coef", a.kl_coef, "KL in the reward and the KL loss are mutually exclusive",
                      "set algo.kl_coef=0 or algo.use_kl_loss=false")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1:
        yield Problem("algo.eps_clip_c", a.eps_clip_c, "the dual-clip constant must be > 1", "set algo.eps_clip_c=3.0 or null")
    if a.kl_coef != 0 and a.advantage_estimator not in KL_IN_REWARD:
        yield Problem("algo.kl_coef", a.kl_coef,
                      f"KL in the reward shapes {', '.join(KL_IN_REWARD)} rewards; {a.advantage_estimator} ignores it",
                      "set algo.kl_coef=0 and use algo.use_kl_loss=true with algo.kl_loss_coef instead")
    if a.kl_coef != 0 and cfg.checkpoint.ref_load is None:
        yield Problem("algo.kl_coef", a.kl_coef, "KL in the reward needs a reference model but checkpoint.ref_load is null",
                      "set checkpoint.ref_load=<HF dir of the reference model>")
    if a.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline") and not a.normalize_advantages:
        yield Problem("algo.normalize_advantages", False, f"{a.advantage_estimator} requires advantage whitening",
                      "set algo.normalize_advantages=true")
    if a.use_tis and a.use_rollout_logprobs:
        yield Problem("algo.use_tis", True, "TIS and algo.use_rollout_logprobs are mutually exclusive",
                      "set algo.use_tis=false or algo.use_rollout_logprobs=false")
    if a.advantage_estimator == "sft":
        for key in ("use_tis", "use_rollout_logprobs"):
            if getattr(a, key):
                yield Problem(f"algo.{key}", True, "sft samples have no engine log-probs", f"set algo.{key}=false")
    if a.advantage_estimator == "sft" and cfg.eval.interval:
        yield Problem("eval.interval", cfg.eval.interval, "sft has nothing to generate or reward at eval time",
                      "set eval=none")
    if a.advantage_estimator == "rloo" and cfg.rollout.n_samples_per_prompt < 2:
        yield Problem("rollout.n_samples_per_prompt", cfg.rollout.n_samples_per_prompt,
                      "rloo's leave-one-out baseline needs at least 2 samples per prompt", "set it to 2 or more")
    if a.tis_clip_low > a.tis_clip:
        yield Problem("algo.tis_clip_low", a.tis_clip_low, f"must be <= algo.tis_clip={a.tis_clip}", "lower algo.tis_clip_low")
    if a.num_critic_only_steps and a.advantage_estimator != "ppo":
        yield Problem("algo.num_critic_only_steps", a.num_critic_only_steps, "only ppo has a critic",
                      "set algo.num_critic_only_steps=0")
    if a.pg_loss_constant_length is not None and a.pg_loss_constant_length <= 0:
        yield Problem("algo.pg_loss_constant_length", a.pg_loss_constant_length, "must be > 0 tokens",
                      "set it to rollout.max_response_len or null")
    if a.overlong_buffer_len is not None and not 0 < a.overlong_buffer_len < cfg.rollout.max_response_len:
        yield Problem("algo.overlong_buffer_len", a.overlong_buffer_len,
                      f"must be in (0, rollout.max_response_len={cfg.rollout.max_response_len})", "pick a smaller window or null")
    if a.dynamic_filter is not None:
        try:
            load_callable(a.dynamic_filter, key="algo.dynamic_filter")
        except ValueError as exc:
            yield Problem("algo.dynamic_filter", a.dynamic_filter, str(exc), "give an importable module.function")
    if a.eps_clip <= 0:
        yield Problem("algo.eps_clip", a.eps_clip, "must be > 0", "set algo.eps_clip=0.2")


def check_rewards(cfg: RunConfig) -> Iterator[Problem]:
    from slime.registry import REWARD_TYPES

    r = cfg.rollout
    if cfg.algo.advantage_estimator == "sft":
        return  # sft trains on the data's responses: no reward
    if r.custom_rm_path is None and r.rm_type is None:
        yield Problem("rollout.rm_type", None, "no reward: neither rollout.rm_type nor rollout.custom_rm_path is set",
                      f"set rollout.rm_type=<one of {', '.join(REWARD_TYPES.names())}> or rollout.custom_rm_path=<module.fn>")
    elif r.rm_type is not None and r.rm_type not in REWARD_TYPES:
        yield from _one_of("rollout.rm_type", r.rm_type, tuple(REWARD_TYPES.names()))


def check_paths(cfg: RunConfig) -> Iterator[Problem]:
    """Paths that must exist; those the run generates itself on first use are exempt."""
    generated = {cfg.model.hf_checkpoint} if cfg.model.create_if_missing else set()
    candidates = [
        ("checkpoint.load", cfg.checkpoint.load, None),
        ("checkpoint.ref_load", cfg.checkpoint.ref_load, None),
        ("train.critic.load", cfg.train.critic.load, None),
        ("data.prompt_data", cfg.data.prompt_data, cfg.data.generator),
        ("eval.prompt_data", cfg.eval.prompt_data if cfg.eval.interval else None, cfg.eval.generator),
    ]
    for key, path, generator in candidates:
        if path is None or generator is not None or path in generated:
            continue
        if not Path(_strip_slice(path)).exists():
            yield Problem(key, path, "path does not exist", f"point {key} at an existing path (absolute paths are safest)")
    if cfg.data.prompt_data is None:
        yield Problem("data.prompt_data", None, "no prompt data", "set data.prompt_data=<file.jsonl> or pick data=digit_task")
    yield from check_model_checkpoint(cfg)


def _strip_slice(path: str) -> str:
    """`file.jsonl@[0:100]` names rows of file.jsonl (REFERENCE.md §5.1)."""
    return path.split("@[", 1)[0]


def check_model_checkpoint(cfg: RunConfig) -> Iterator[Problem]:
    from slime.assets.tiny_model import hf_config_dict, read_hf_config

    m = cfg.model
    if m.create_if_missing:
        return  # generated from these very fields before the run starts (slime.assets.prepare)
    config_file = Path(m.hf_checkpoint) / "config.json"
    if not config_file.exists():
        yield Problem("model.hf_checkpoint", m.hf_checkpoint, "no config.json there",
                      "download the HF checkpoint to that directory or set model.hf_checkpoint=<dir>")
        return
    actual = read_hf_config(m.hf_checkpoint)
    expected = hf_config_dict(m, eos_token_id=0, pad_token_id=0) if m.architecture == "qwen3" else {}
    names = {"hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size", "num_hidden_layers": "num_layers",
             "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_query_groups",
             "head_dim": "kv_channels", "vocab_size": "vocab_size", "rms_norm_eps": "norm_epsilon",
             "rope_theta": "rotary_base", "tie_word_embeddings": "tie_word_embeddings"}
    for hf_key, our_key in names.items():
        if hf_key in actual and hf_key in expected and actual[hf_key] != expected[hf_key]:
            yield Problem(f"model.{our_key}", getattr(m, our_key), f"{config_file} has {hf_key}={actual[hf_key]}",
                          f"set model.{our_key}={actual[hf_key]} or pick the model option matching the checkpoint")


def collect_problems(cfg: RunConfig) -> list[Problem]:
    derived = derive(cfg)
    checks = [check_choices(cfg), check_debug(cfg), check_ranges(cfg), check_batch_arithmetic(cfg),
              check_cluster(cfg, derived), check_parts_honour_options(cfg, derived), check_algo(cfg),
              check_rewards(cfg), check_paths(cfg)]
    return [problem for check in checks for problem in check]


def validate(cfg: RunConfig) -> Derived:
    """Raise ConfigError listing every problem; return the derived values when there are none."""
    problems = collect_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return derive(cfg)

