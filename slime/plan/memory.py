"""Per-GPU memory estimate of a run, from its config alone (no torch): part of the RunPlan, printed by the dry run.

N = parameters of the policy: embedding V·H (twice when the output layer is untied) + per layer
[attention H·Q + 2·H·KV + Q·H (MLA: its latent projections), SwiGLU MLP 3·H·F (MoE layers: the routed experts,
router and shared experts), norms 2·H (+ q/k norms, biases)] + final norm H, with Q = heads·d and KV = kv_heads·d
(d = kv_channels); slime.models.shape has each term. Training, per GPU of a rank (s = the rank's shard of N):
    fsdp      s = N / (dp·tp): FSDP2 shards parameters, gradients and optimizer state over every rank;
              weights 4 B (fp32 parameters; bf16 is autocast compute), gradients 4 B, optimizer 8 B
              (Adam m and v, fp32); plus the gathered parameters (`gathered`) while a micro-batch computes: one
              layer's (N_layer · 2 B) with dp > 1, every layer's (N · 2 B, bf16 compute copies; 4 B under
              autocast) with one dp rank, which keeps them from its forward to its backward (nothing to save
              by resharding). Gradients exist only from the backward to the optimizer step, so with one
              micro-batch a step they never meet its activations: peak = state + max(gradients, activations +
              logits); with more, the later micro-batches' activations sit on the earlier ones' gradients
    megatron  s = N / (tp·pp) (for unequal pipeline stages N·tp⁻¹ times the fullest stage's share of the layers);
              weights 2 B (bf16) or 4 B (fp32), gradients 4 B (fp32 main grads, a buffer held throughout),
              optimizer 12 B (fp32 master copy + m + v) further divided by dp (distributed optimizer)
    reference model (KL terms), distillation teacher (algo.use_opd): fsdp each N · 2 B (bf16) or 4 B (a
              whole transformers model on every rank), 0 with train.ref_offload (on the GPU only for its
              forward); megatron 0 (host copies swapped into the policy's tensors for their forward)
    activations: T·L/(tp·cp) · 2 B · (3·H + 3·Q + 3·KV + 4·F) -- the tensors a decoder layer keeps for
              backward per token with packed (varlen) attention, no [S, S] scores: the norms' inputs and
              output, q and k before and after their norms and RoPE, v, the attention output, SwiGLU's gate,
              up, activation and product; where the backend recomputes every layer (its record's
              full_recompute: fsdp gradient_checkpointing, megatron recompute.granularity=full) only the layer
              inputs T·L·H·2 B/(tp·cp) plus one layer's (selective recompute counts as none: an upper bound).
              T = the most tokens a micro-batch can hold (micro_batch_tokens): parallelism.max_tokens_per_gpu,
              else micro_batch_size samples, at most a rank's samples of one optimizer step
              (train.global_batch_size / dp), each of rollout.max_prompt_len (1024 assumed where unset) +
              rollout.max_response_len tokens. A bound: a run whose samples are shorter reports its largest
              micro-batch (perf/micro_batch_tokens), and its end summary sizes the plan by that
    logits: 2 · 1024 · V · 4 B (the LM head's fp32 logits and their gradient, 1024 tokens at a time)
Engines, per GPU of an engine (g = cluster.rollout.num_gpus_per_engine):
    weights N · 2 B / g (bf16); sglang reserves mem_fraction_static (rollout.sglang, default 0.8) of
    the GPU for weights + KV cache, so KV cache = fraction·GPU - weights (vllm: its gpu_memory_utilization,
    rollout.vllm, default 0.92 in vLLM 0.32.0, the same way); the hf engine holds weights +
    the KV cache of rollout.hf.max_batch_size sequences of max_prompt_len (1024 assumed) + max_response_len tokens
    (2·L·KV·2 B per token; MLA: L·(kv_lora_rank + rotary dims)·2 B); on CUDA with rollout.hf.cuda_graphs its slots
    (slime/engine/hf/static_cache.py) round the sequences up to a power of two and the tokens to 256.
Colocated GPUs hold the trainer's state (weights, gradients, optimizer, reference, teacher) throughout, the
engine's reservation while generating (released while training: SGLang's memory saver) and the
activations, logits and gathered parameters while training: peak = state + max(engine, what training adds). The
GPU size is debug.gpu_memory_gib, else this machine's GPU (nvidia-smi), else 80 GiB. Not counted: allocator
fragmentation, the CUDA context (~0.5-1 GiB), communication buffers. On the Qwen3-1.7B shape (one H200,
tools/bench_train.py, the plan sized by the batch's largest micro-batch) the estimate was 0.97-1.11x of the measured
peaks for both backends, with and without recompute, LoRA included (docs/performance.md has the table).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

from slime.config.derived import Derived
from slime.config.problems import get as config_value
from slime.config.schema import RunConfig
from slime.models.flops import active_ffn_width
from slime.models.shape import (
    attention_parameters,
    dense_layer_count,
    kv_cache_width,
    layer_norm_parameters,
    moe_layer_count,
    moe_layer_other_weights,
    qk_head_width,
    routed_expert_weights,
    uses_mla,
    v_head_width,
    vision_parameters,
)
from slime.plan.sync_memory import staging_bytes
from slime.registry import ENGINES, TRAIN_BACKENDS
from slime.train.layout import pipeline_stage_layers

GIB = 1 << 30
TRANSIENT = ("activations", "logits", "gathered")  # held only while a micro-batch computes
ASSUMED_PROMPT_TOKENS = 1024
LOGITS_CHUNK_TOKENS = 1024
DEFAULT_GPU_GIB = 80.0


def parameter_count(cfg: RunConfig) -> tuple[int, int]:
    """(parameters of the model, parameters of its mean decoder layer), MoE experts and routers included, by the
    layer kinds of slime.models.shape (dense and MoE layers, GQA or MLA attention), a vision tower's too."""
    m = cfg.model
    h = m.hidden_size
    layers = m.num_layers * (attention_parameters(m) + layer_norm_parameters(m))
    layers += dense_layer_count(m) * 3 * h * m.ffn_hidden_size
    if m.num_experts is not None:
        layers += moe_layer_count(m) * moe_layer_other_weights(m) + _expert_parameters(cfg)
    embed = m.vocab_size * h * (1 if m.tie_word_embeddings else 2)
    return embed + layers + h + vision_parameters(m), layers // m.num_layers


def _expert_parameters(cfg: RunConfig) -> int:
    """Parameters of every routed expert of the model (0 for a dense model): megatron splits them by ep x etp."""
    m = cfg.model
    if m.num_experts is None:
        return 0
    return moe_layer_count(m) * routed_expert_weights(m)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, by what holds them; `capacity` is the GPU size checked against."""

    capacity: float
    train: dict[str, float]  # weights, gradients, optimizer, reference, teacher, gathered, activations, logits
    engine: dict[str, float]  # weights, kv_cache
    colocated: bool
    kv_tokens: int  # tokens the engine's KV cache holds
    engine_fix: str  # the knob that shrinks the engine's share
    # whether a micro-batch's activations sit on gradients: a gradient buffer held throughout (megatron), or a
    # later micro-batch of an optimizer step (FSDP2 makes gradients in the backward and frees them at each step)
    gradients_meet_activations: bool = True

    @property
    def train_state(self) -> float:
        """What a trainer holds between its steps (while a colocated engine generates)."""
        return sum(v for k, v in self.train.items() if k not in TRANSIENT)

    @property
    def train_peak(self) -> float:
        t = self.train
        if self.gradients_meet_activations:
            return sum(t.values())
        held = sum(v for k, v in t.items() if k not in ("activations", "logits", "gradients"))
        return held + max(t["gradients"], t["activations"] + t["logits"])

    @property
    def engine_total(self) -> float:
        return sum(self.engine.values())

    @property
    def peak(self) -> float:
        """The fullest GPU: colocated, the shared one; else the larger of a trainer's and an engine's."""
        if self.colocated:
            return self.train_state + max(self.engine_total, self.train_peak - self.train_state)
        return max(self.train_peak, self.engine_total)

    def warnings(self) -> list[str]:
        size = f"but a GPU holds {self.capacity / GIB:.0f} GiB"
        trainer_fix = (
            "lower parallelism.max_tokens_per_gpu, raise parallelism.tp, turn on parallelism.gradient_checkpointing "
            "or train.ref_offload, or use more training GPUs"
        )
        out = []
        if self.colocated and self.peak > self.capacity:
            out.append(
                f"a colocated GPU (trainer + engine) needs ~{self.peak / GIB:.1f} GiB {size}: {self.engine_fix}, or "
                f"{trainer_fix}"
            )
        if not self.colocated and self.train_peak > self.capacity:
            out.append(f"a training GPU needs ~{self.train_peak / GIB:.1f} GiB {size}: {trainer_fix}")
        if not self.colocated and self.engine_total > self.capacity:
            out.append(f"an engine GPU needs ~{self.engine_total / GIB:.1f} GiB {size}: {self.engine_fix}")
        if self.engine["kv_cache"] <= 0:
            out.append("the engine's weights fill its memory reservation: no room for a KV cache")
        return out


def gpu_capacity_gib(cfg: RunConfig) -> tuple[float, str]:
    """(GPU size in GiB, where that number came from)."""
    if cfg.debug.gpu_memory_gib:
        return cfg.debug.gpu_memory_gib, "debug.gpu_memory_gib"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.split()
            if out:
                return float(out[0]) / 1024, "this machine's GPU"
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return DEFAULT_GPU_GIB, "assumed (set debug.gpu_memory_gib)"


def _recomputes_every_layer(cfg: RunConfig) -> bool:
    """Whether the backend keeps only each layer's input for backward (its record's `full_recompute`)."""
    key, value = TRAIN_BACKENDS.facts(cfg.parallelism.backend).full_recompute
    return config_value(cfg.parallelism, key) == value


def _bf16_params(cfg: RunConfig, derived: Derived) -> bool:
    """Whether a fully sharded backend holds bf16 parameters where it can: its record's `bf16_lora_base` option (FSDP2's
    mixed-precision policy) is chosen in a bf16 run."""
    held = TRAIN_BACKENDS.facts(cfg.parallelism.backend).bf16_lora_base
    return derived.precision == "bf16" and held is not None and config_value(cfg.parallelism, held[0]) == held[1]


def _base_bytes(cfg: RunConfig, derived: Derived) -> int:
    """Bytes per weight of a fully sharded policy: fp32 master weights, or a LoRA policy's frozen base in bf16 where
    the backend's record says it holds it so (`bf16_lora_base`)."""
    return 2 if cfg.model.lora.enabled and _bf16_params(cfg, derived) else 4


def _train_bytes(cfg: RunConfig, derived: Derived, n: int, n_layer: int, tokens: int) -> dict[str, float]:
    p, m = cfg.parallelism, cfg.model
    bf16 = derived.precision == "bf16"
    q, kv = m.num_attention_heads * qk_head_width(m), m.num_attention_heads * v_head_width(m)
    if not uses_mla(m):
        kv = m.num_query_groups * m.kv_channels
    facts = TRAIN_BACKENDS.facts(p.backend)
    if facts.fully_sharded_state:
        shard = n / max(derived.dp_size * p.tp, 1)
        # with LoRA the base is frozen: gradients and optimizer state for the adapters alone (their weights too)
        trained = m.lora.parameter_count(m) / max(derived.dp_size * p.tp, 1) if m.lora.enabled else shard
        state = {"weights": _base_bytes(cfg, derived) * shard + 4 * trained * m.lora.enabled}
        state |= {"gradients": 4 * trained, "optimizer": 8 * trained}
    else:
        # Experts are split by ep x etp and their optimizer state over the expert-data-parallel ranks
        # (world / (ep x etp x pp)), which are fewer than the dense parameters' dp ranks.
        experts = _expert_parameters(cfg)
        share = _fullest_stage_share(cfg)
        dense, expert = (n - experts) * share / max(p.tp, 1), experts * share / max(p.ep * p.etp, 1)
        shard = dense + expert
        world = derived.dp_size * p.tp * p.pp * p.cp
        state = {"weights": (2 if bf16 else 4) * shard, "gradients": 4 * shard}
        state["optimizer"] = 12 * (dense / max(derived.dp_size, 1) + expert * p.ep * p.etp * p.pp / max(world, 1))
    # one frozen model of the policy's shape, whole (never sharded), where the backend keeps it on the GPU
    frozen = (2 if bf16 else 4) * n if facts.frozen_models_on_gpu and not cfg.train.ref_offload else 0.0
    # with LoRA the policy's own checkpoint as the reference is the policy with its adapters off: no copy
    ref_is_base = m.lora.enabled and cfg.checkpoint.ref_load == m.hf_checkpoint
    state["reference"] = frozen if (cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0) and not ref_is_base else 0.0
    state["sync_staging"] = staging_bytes(cfg, derived)  # kept between pushes on the source rank (sync_memory.py)
    state["teacher"] = frozen if cfg.algo.use_opd else 0.0
    state["gathered"] = _gathered_bytes(cfg, derived, n, n_layer) if facts.fully_sharded_state else 0.0
    split = max(p.tp * p.cp, 1)
    per_token_layer = 2 * (3 * m.hidden_size + 3 * q + 3 * kv + 4 * active_ffn_width(cfg.model))
    if _recomputes_every_layer(cfg):
        acts = tokens * (m.num_layers * m.hidden_size * 2 + per_token_layer) / split
    else:
        acts = tokens * m.num_layers * per_token_layer / split
    state["activations"] = acts
    state["logits"] = 2 * LOGITS_CHUNK_TOKENS * m.vocab_size * 4
    return state


def _gathered_bytes(cfg: RunConfig, derived: Derived, n: int, n_layer: int) -> float:
    """FSDP2's unsharded parameters while a micro-batch computes: with one dp rank every layer's stays gathered from
    its forward to its backward (the backend does not reshard after the forward), else one layer's at a time; bf16
    copies under FSDP2's mixed-precision policy (the option `bf16_lora_base` names), fp32 ones otherwise."""
    width = 2 if _bf16_params(cfg, derived) else 4
    return width * (n / max(cfg.parallelism.tp, 1) if derived.dp_size == 1 else n_layer)


@dataclasses.dataclass(frozen=True)
class MicroBatchBound:
    """The most tokens one micro-batch can hold (`tokens`), how the plan arrived at it (`reason`, a phrase), and
    whether a rank's optimizer step can take more than one micro-batch (`several`)."""

    tokens: int
    reason: str
    several: bool = True


def micro_batch_tokens(cfg: RunConfig, derived: Derived) -> MicroBatchBound:
    """The tokens of a full micro-batch, which the activations are sized by: parallelism.max_tokens_per_gpu (one
    sample longer than it is a micro-batch of its own), else parallelism.micro_batch_size samples; never more than
    a rank's samples of one optimizer step. A sample is rollout.max_prompt_len + rollout.max_response_len tokens
    (the prompt ASSUMED_PROMPT_TOKENS where no limit is set)."""
    p, r = cfg.parallelism, cfg.rollout
    prompt = r.max_prompt_len or ASSUMED_PROMPT_TOKENS
    sample = prompt + r.max_response_len
    per_rank = max(cfg.train.global_batch_size // max(derived.dp_size, 1), 1)
    prompt_why = "rollout.max_prompt_len" if r.max_prompt_len else "assumed: rollout.max_prompt_len unset"
    sample_why = f"({prompt} prompt tokens, {prompt_why}, + {r.max_response_len} rollout.max_response_len)"
    if p.max_tokens_per_gpu:
        if per_rank * sample <= p.max_tokens_per_gpu:
            reason = f"a rank's {per_rank} samples a step x {sample_why}"
            return MicroBatchBound(per_rank * sample, reason, several=False)
        return MicroBatchBound(max(p.max_tokens_per_gpu, sample), "parallelism.max_tokens_per_gpu")
    samples, why = p.micro_batch_size, "parallelism.micro_batch_size"
    if per_rank < samples:
        samples, why = per_rank, "a rank's samples of one optimizer step"
    return MicroBatchBound(samples * sample, f"{samples} samples ({why}) x {sample_why}", several=per_rank > samples)


def _fullest_stage_share(cfg: RunConfig) -> float:
    """The share of the layers on the fullest pipeline stage: 1/pp where the stages are equal."""
    p, layers = cfg.parallelism, cfg.model.num_layers
    try:
        stages = pipeline_stage_layers(layers, p.pp, first=p.pp_first_stage_layers, last=p.pp_last_stage_layers)
    except ValueError:  # the backend's validation names the split it refuses; the estimate is of an equal one
        return 1 / max(p.pp, 1)
    return max(stages) / layers


def estimate_memory(
    cfg: RunConfig, derived: Derived, *, micro_batch: int | None = None, several: bool | None = None
) -> MemoryEstimate:
    """Bytes per GPU of the run: activations for full micro-batches (micro_batch_tokens), or for micro-batches of
    `micro_batch` tokens (a run's largest, measured); `several`: whether an optimizer step took more than one
    micro-batch (None: whether the config lets it, micro_batch_tokens)."""
    bound = micro_batch_tokens(cfg, derived)
    several = bound.several if several is None else several
    capacity = gpu_capacity_gib(cfg)[0] * GIB
    n, n_layer = parameter_count(cfg)
    m, r = cfg.model, cfg.rollout
    g = max(cfg.cluster.rollout.num_gpus_per_engine, 1)
    weights = 2 * n / g
    kv_per_token = m.num_layers * kv_cache_width(m) * 2 / g
    facts = ENGINES.facts(r.engine)
    if facts.memory_fraction_key:
        section, option = facts.memory_fraction_key.split(".")
        fraction = float(getattr(r, section).get(option, facts.memory_fraction_default))
        kv_cache = fraction * capacity - weights
        fix = f"lower rollout.{facts.memory_fraction_key}"
    else:
        sequences, tokens = derived.hf_max_batch_size, (r.max_prompt_len or ASSUMED_PROMPT_TOKENS) + r.max_response_len
        if cfg.cluster.device == "cuda" and r.hf.cuda_graphs:  # its slots: whole graph buckets of 256-token columns
            sequences, tokens = 1 << max(sequences - 1, 0).bit_length(), -(-tokens // 256) * 256
        kv_cache = sequences * tokens * kv_per_token
        fix = "lower rollout.hf.max_batch_size (sequences decoded together) or rollout.max_response_len"
    return MemoryEstimate(
        capacity=capacity,
        train=_train_bytes(cfg, derived, n, n_layer, micro_batch or bound.tokens),
        engine={"weights": weights, "kv_cache": kv_cache},
        colocated=cfg.cluster.colocate,
        kv_tokens=int(max(kv_cache, 0) // kv_per_token),
        engine_fix=fix,
        gradients_meet_activations=several or not TRAIN_BACKENDS.facts(cfg.parallelism.backend).fully_sharded_state,
    )


def memory_plan_gib(
    cfg: RunConfig, derived: Derived, largest_micro_batch: int | None, *, several: bool | None = None
) -> dict[str, float]:
    """What result.json keeps of the plan, GiB per GPU: the trainer's peak for full micro-batches (`trainer`, the
    dry run's figure, with their tokens), the engine's, and where the run reported its fullest micro-batch
    (`perf/micro_batch_tokens`), the trainer's peak for micro-batches of that size (`trainer_sized`), `several`
    saying whether an optimizer step took more than one (`perf/micro_batches_per_step`; None: as the config lets)."""
    full = estimate_memory(cfg, derived)
    out = {
        "trainer": full.train_peak / GIB,
        "engine": full.engine_total / GIB,
        "micro_batch_tokens": micro_batch_tokens(cfg, derived).tokens,
    }
    if largest_micro_batch:
        sized = estimate_memory(cfg, derived, micro_batch=largest_micro_batch, several=several)
        out |= {"trainer_sized": sized.train_peak / GIB, "largest_micro_batch_tokens": largest_micro_batch}
    return out
