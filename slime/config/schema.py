"""Typed schemas for every config group (docs/configuration.md); key names mirror slime's flags.

Each dataclass is registered in Hydra's ConfigStore (see `store.py`) and is the schema its YAML options
extend, so a misspelled key or a wrongly typed value fails at compose time. A part's own options (`rollout.hf`,
`parallelism.fsdp`, ...) are declared beside the part and joined to these by slime/run_schema.py. `OmegaConf.to_object`
turns the composed config into these objects once, in `main.py`; nothing below reads a DictConfig.

Units are stated per field: "samples" are responses, "prompts" are groups of n samples. The rollout group's
schema lives in `schema_rollout.py`, the bookkeeping groups' (eval, checkpoint, logger, paths, debug, runtime) in
`schema_run.py`; both are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from slime.config.async_mode import AsyncMode
from slime.config.input_kinds import HOST, MODEL_CHECKPOINT, PATH_READ, PATH_WRITTEN, RAY_ADDRESS
from slime.config.schema_lora import LoRAConfig
from slime.config.schema_rollout import (  # noqa: F401  (re-exported: the run's schema in one place)
    AgentConfig,
    FaultToleranceConfig,
    RewardConfig,
    RolloutConfig,
    RouterConfig,
    ServedModelConfig,
    ServerGroupConfig,
    WeightSyncConfig,
)
from slime.config.schema_run import (  # noqa: F401  (re-exported: the run's schema in one place)
    RUN_PHASES,
    CheckpointConfig,
    DebugConfig,
    EvalConfig,
    EvalDatasetConfig,
    LoggerConfig,
    PathsConfig,
    PhasePoint,
    RuntimeConfig,
    WandbConfig,
)
from slime.config.schema_vision import VisionConfig


def _keyword_field(name: str, annotation: str, default: Any):
    """Add a config key named like a Python keyword (`train.async`), which a class body cannot declare.

    The field stays out of `__init__`, `repr` and `==` (their generated code would not compile); OmegaConf
    reads and sets it by name like any other. `dataclasses.replace` does not copy such a field (it resets
    to `default`), so code reads it from the run's config, never from a replaced copy."""

    def add(cls):
        cls.__annotations__[name] = annotation
        setattr(cls, name, field(default=default, init=False, repr=False, compare=False))
        return cls

    return add


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture of the policy plus its HF checkpoint directory.

    The architecture fields are checked against `hf_checkpoint/config.json`, which must exist, with one
    exception: an option may name in `generate_at` the directory where it makes its model on first use (a
    tiny option: randomly initialised weights of this shape and the offline tokenizer; an option with
    `import_gguf`: a real model's GGUF file, imported), and the run makes it there only when `hf_checkpoint`
    is that very directory (`slime.assets.check.generates_checkpoint`); a path the user types is never
    generated into, so a typo cannot train a model the user never had.
    """

    name: str = MISSING
    hf_checkpoint: str = field(default=MISSING, metadata=MODEL_CHECKPOINT)
    generate_at: Optional[str] = field(default=None, metadata=PATH_WRITTEN)
    # `<package>/<file>.gguf` inside an installed package: the model made at generate_at is this file's
    # weights (de-quantized, fp32 safetensors: slime.assets.gguf_import), not a random initialisation
    import_gguf: Optional[str] = None
    init_seed: int = 0  # seed of the random initialisation (generated models only)
    init_std: float = 0.02  # std of the normal initialisation, HF's initializer_range (generated models only)
    architecture: str = "qwen3"
    num_layers: int = MISSING
    hidden_size: int = MISSING
    ffn_hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    num_query_groups: int = MISSING
    kv_channels: int = MISSING
    vocab_size: int = MISSING
    norm_epsilon: float = 1e-6
    rotary_base: float = 1_000_000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    # Family details (defaults: Qwen3 dense). architecture: qwen3 | qwen3_moe | qwen2 | llama | glm4 | glm4_moe |
    # deepseek_v3 (MLA: kv_channels is transformers' head_dim there, the rotary part of a q/k head)
    qk_layernorm: bool = True  # RMSNorm over each q/k head (Qwen3, GLM-4.5's use_qk_norm); False for Qwen2/Llama
    add_qkv_bias: bool = False  # bias on q/k/v projections (Qwen2)
    rotary_percent: float = 1.0  # fraction of head_dim rotated (GLM-4: 0.5)
    # HF config.json's rope_scaling dict (Llama-3: rope_type llama3), or None. Typed Any: omegaconf cannot merge a
    # command line's dict into a None Optional[dict] node (model.rope_scaling={...} raised AttributeError); the
    # dict is checked in slime.models.families.check_model
    rope_scaling: Any = None
    num_experts: Optional[int] = None  # MoE: routed experts per layer; None = dense
    moe_router_topk: int = 2  # experts per token
    moe_ffn_hidden_size: Optional[int] = None  # FFN width of one routed expert (HF moe_intermediate_size)
    moe_shared_expert_intermediate_size: Optional[int] = None  # None: no shared expert
    moe_norm_topk_prob: bool = True  # renormalise the top-k router probabilities to sum to 1
    moe_aux_loss_coeff: float = 0.0  # load-balancing loss coefficient
    # GLM-4.5 / DeepSeek-V3 MoE: the first layers keep a dense FFN of ffn_hidden_size (HF first_k_dense_replace);
    # routed weights scaled by this factor; experts chosen within the top groups (HF n_group, topk_group)
    moe_first_dense_layers: int = 0
    moe_routed_scaling_factor: float = 1.0
    moe_router_num_groups: Optional[int] = None
    moe_router_group_topk: Optional[int] = None
    # Multi-head latent attention (deepseek_v3): q through a rank-q_lora_rank bottleneck (None: a full projection),
    # k and v through kv_lora_rank; each head's q/k is qk_head_dim without RoPE plus qk_pos_emb_head_dim with it
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_head_dim: Optional[int] = None
    qk_pos_emb_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # adapters instead of full fine-tuning (rank 0: off)
    vision: Optional[VisionConfig] = None  # a vision-language model's vision tower (architecture qwen2_5_vl)


@dataclass(kw_only=True)
class RecomputeConfig:
    """Activation recomputation of the megatron backend (megatron-core's recompute_* fields)."""

    granularity: Optional[str] = None  # full | selective; None: keep every activation
    method: Optional[str] = None  # full: uniform | block (default uniform)
    num_layers: Optional[int] = None  # full: layers per group (uniform) or recomputed layers (block); default 1
    modules: Optional[list[str]] = None  # selective: megatron's recompute_modules (default ["core_attn"])


@dataclass(kw_only=True)
class ParallelismConfig:
    """How training is split. DP = world / (tp·pp·cp), derived. Each backend's own options (`parallelism.fsdp`,
    `parallelism.megatron`) live beside the backend, named by its spec, and join this node in the run's schema
    (slime/run_schema.py)."""

    backend: str = "fsdp"  # a name of slime.registry.TRAIN_BACKENDS
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    micro_batch_size: int = 8  # samples per forward/backward on one DP rank (when max_tokens_per_gpu is unset)
    # Dynamic micro-batching: a step's samples are first-fit into bins of at most this many tokens
    # (prompt + response) per forward/backward on one GPU; a longer sample gets a bin of its own. When set
    # it wins over micro_batch_size.
    max_tokens_per_gpu: Optional[int] = None
    gradient_checkpointing: bool = False  # recompute each decoder layer in the backward pass
    # FP8 matmuls in training (fsdp: torchao's float8 training of the decoder layers' linears, CUDA compute
    # capability 8.9+; megatron: needs Transformer Engine); weights, gradients and optimizer keep their precision
    fp8: bool = False
    # megatron backend: virtual pipeline stages per pipeline rank (interleaved 1F1B; None: one) and recompute
    vpp: Optional[int] = None
    # megatron backend: decoder layers of the first / last pipeline stage (None: an equal share), the others split
    # the rest equally, as megatron's num_layers_in_first/last_pipeline_stage (slime's --decoder-first/last-pipeline-
    # num-layers): DeepSeek-V3's 61 layers split over no pp equally
    pp_first_stage_layers: Optional[int] = None
    pp_last_stage_layers: Optional[int] = None
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    compile_layers: bool = False  # megatron backend: torch.compile each transformer layer; CUDA only


@dataclass(kw_only=True)
class DeviceGroupConfig:
    """GPUs (CPU bundles when cluster.device=cpu) of one role."""

    num_nodes: int = 1
    num_gpus_per_node: int = 1


@dataclass(kw_only=True)
class RolloutResourcesConfig:
    """GPUs of the rollout engines (CPU bundles when cluster.device=cpu)."""

    num_gpus: int = 1  # total over all engines; ignored (= actor GPUs) when colocated
    num_gpus_per_engine: int = 1


@dataclass(kw_only=True)
class CriticResourcesConfig:
    """PPO's critic: its own GPUs (None = as many as the actor, like slime) or the actor's GPUs."""

    num_nodes: Optional[int] = None
    num_gpus_per_node: Optional[int] = None
    colocate_with_actor: bool = False


@dataclass(kw_only=True)
class ClusterConfig:
    """The machines a run may use and how roles are placed on them."""

    device: str = "cpu"  # cuda | cpu
    ray_address: Optional[str] = field(
        default=None, metadata=RAY_ADDRESS
    )  # join an existing Ray cluster; None starts one locally
    num_nodes: int = 1  # capacity of the cluster
    num_gpus_per_node: int = 2  # capacity per node (CPU bundles when device=cpu)
    host: str = field(default="127.0.0.1", metadata=HOST)  # address engines and the router bind to
    colocate: bool = False
    # bf16 dense TFLOP/s of one GPU, the denominator of perf/mfu; None: measured on each trainer GPU at start-up
    # (an 8192³ bf16 matmul, as tools/bench_train.py), and no perf/mfu on CPU runs
    peak_tflops: Optional[float] = None
    actor: DeviceGroupConfig = field(default_factory=DeviceGroupConfig)
    critic: CriticResourcesConfig = field(default_factory=CriticResourcesConfig)
    rollout: RolloutResourcesConfig = field(default_factory=RolloutResourcesConfig)


@dataclass(kw_only=True)
class DataConfig:
    """The training prompts: file, keys of its records, chat templating, shuffling (docs/data-and-rewards.md)."""

    prompt_data: Optional[str] = field(default=None, metadata=PATH_READ)  # .jsonl or .parquet
    input_key: str = "prompt"
    label_key: Optional[str] = "label"
    metadata_key: Optional[str] = "metadata"
    apply_chat_template: bool = True
    shuffle: bool = True
    # Loading (slime.rollout.prompt_file, slime.rollout.data_source)
    tool_key: Optional[str] = "tools"  # tool specs (list or JSON string): metadata["tools"] and the chat template
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template kwargs
    # modality -> the record's key holding it (slime's --multimodal-keys), e.g. {image: images}: each record's image
    # references (paths, URLs or base64), for a vision-language model; {} for text
    multimodal_keys: dict[str, str] = field(default_factory=dict)
    seed: int = 42  # per-epoch shuffle permutation seed + epoch (slime's --rollout-seed)
    source_class: Optional[str] = None  # import path of a DataSourceBase subclass; None: the built-in DataSource
    # Synthetic tasks: a `_target_` node `{_target_: module.fn, path: <file>, ...}`; `fn(path=..., **rest)` writes
    # exactly `path`, and runs only when prompt_data is that path and the file is missing.
    generator: Optional[Any] = None


@dataclass(kw_only=True)
class CriticTrainConfig:
    """Role overrides for PPO's critic (slime's --critic-lr/--critic-load/--critic-save)."""

    lr: Optional[float] = None  # default: train.lr
    lr_warmup_steps: Optional[int] = None  # default: train.lr_warmup_steps
    load: Optional[str] = field(
        default=None, metadata=PATH_READ
    )  # critic checkpoint root; default: value head on the policy checkpoint
    save: Optional[str] = field(default=None, metadata=PATH_WRITTEN)  # default: <checkpoint.save>/critic


def resolved_precision(precision: str, device: str) -> str:
    """`train.precision` (or an engine's dtype, by either name: fp32/float32, bf16/bfloat16) as fp32 or bf16; auto
    is bf16 on cuda, fp32 on cpu."""
    named = {"float32": "fp32", "bfloat16": "bf16"}.get(precision, precision)
    if named != "auto":
        return named
    return "bf16" if device == "cuda" else "fp32"


@dataclass(kw_only=True)
@_keyword_field("async", "Any", "off")
class TrainConfig:
    """Optimizer and schedule; batch sizes in samples, steps in optimizer steps.

    `async` (a keyword, declared by `_keyword_field`; read it as `async_mode`): off | one_step | full
    (slime.config.async_mode; false/true mean off/one_step); one_step and full need disaggregated runs.
    """

    num_rollout: Optional[int] = None  # rollout steps in the run; None: derived from num_epoch
    num_epoch: Optional[int] = None  # passes over data.prompt_data: num_rollout = num_epoch × prompts // batch_size
    global_batch_size: Optional[int] = None  # samples per optimizer step over all DP ranks: G
    num_steps_per_rollout: int = 1  # optimizer steps per rollout step: K
    lr: float = 1e-6
    min_lr: float = 0.0
    lr_decay_style: str = "constant"  # constant | linear | cosine
    lr_warmup_steps: int = 0  # optimizer steps
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # max global grad norm; 0 disables clipping
    # a NaN or inf in a step's loss or gradients: stop (exit 3 naming the step and the first non-finite tensor) |
    # skip (no update for that step; train/nonfinite_skipped counts it; the fsdp backend only)
    on_nonfinite: str = "stop"
    precision: str = "auto"  # auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16
    num_threads: int = 1  # torch threads per CPU train actor
    # Keep the frozen models (reference, distillation teacher) on CPU between their forward passes (on the GPU only for them); a no-op
    # on CPU runs
    ref_offload: bool = False
    # a vision-language model's vision tower (and its merger) stays as loaded: not trained (pushes carry it unchanged)
    freeze_vision: bool = False
    critic: CriticTrainConfig = field(default_factory=lambda: CriticTrainConfig())
    # train.async=full: a group whose oldest token came from weights more than this many versions older than the
    # trainer's is not trained (rollout.stale_policy); >= 1 (0 is the synchronous loop)
    max_staleness: int = 1

    @property
    def async_mode(self) -> AsyncMode:
        """The loop `train.async` names (validation has refused any other value)."""
        return AsyncMode.parse(getattr(self, "async"))

    @property
    def is_async(self) -> bool:
        """Generation overlaps training (one_step or full)."""
        return self.async_mode is not AsyncMode.OFF

    @property
    def is_fully_async(self) -> bool:
        """train.async=full; False for a value slime.config.validate_async refuses (the checks beside it ask)."""
        try:
            return self.async_mode is AsyncMode.FULL
        except ValueError:
            return False


@dataclass(kw_only=True)
class AlgoConfig:
    """Loss and advantage knobs; formulas in docs/algorithms.md#formulas."""

    name: str = MISSING
    # a name registered in slime/algo/estimators.py (`python main.py --help` lists them)
    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: Optional[float] = None  # defaults to eps_clip; > eps_clip is DAPO's clip-higher
    eps_clip_c: Optional[float] = None  # dual clip, > 1
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"  # k1 | k2 | k3 | low_var_kl; also the estimator of KL in the reward
    kl_coef: float = 0.0  # KL in the reward (ppo, reinforce_plus_plus*); exclusive with use_kl_loss
    entropy_coef: float = 0.0
    gamma: float = 1.0  # discount (ppo, reinforce_plus_plus)
    lambd: float = 1.0  # GAE lambda (ppo)
    normalize_advantages: bool = False  # whiten over every masked token of the step, all ranks
    disable_rewards_normalization: bool = False  # no group mean/std step at all
    disable_grpo_std_normalization: bool = False  # group mean only (Dr.GRPO)
    calculate_per_token_loss: bool = False  # per-token instead of per-sample reduction
    pg_loss_constant_length: Optional[int] = None  # Dr.GRPO: pg-loss token sums / this constant (tokens)
    use_tis: bool = False  # truncated importance sampling trainer vs engine
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    tis_mode: str = "truncate"  # truncate | icepop
    tis_level: str = "token"  # token | sequence (product of the ratios) | geometric (their geometric mean)
    use_opsm: bool = False  # off-policy sequence masking: drop A < 0 samples that drifted from ℓ_old
    opsm_delta: float = 1.0e-4  # OPSM's threshold on a sample's mean ℓ_old − ℓ (nats)
    use_rollout_logprobs: bool = False  # engine log-probs as the old policy (exclusive with use_tis)
    # on-policy distillation: A_t −= opd_kl_coef·(ℓ_old − ℓ_teacher), the teacher (model@teacher=OPTION, the
    # policy's architecture) loaded into the trainer beside the policy
    use_opd: bool = False
    opd_kl_coef: float = 1.0
    # MoE routing replay (slime.config.routing_replay.RoutingReplay): none | rollout (the engine's routes, R3) | train (the
    # policy's log-prob forward's routes) forced on the trainer's forwards
    routing_replay: str = "none"
    value_clip: float = 0.2  # ppo critic
    num_critic_only_steps: int = 0  # ppo: rollout steps at the start that train the critic only
    dynamic_filter: Optional[Any] = None  # fn(args, group) -> bool | FilterResult, e.g. DAPO's zero-std filter
    overlong_buffer_len: Optional[int] = None  # DAPO soft overlong penalty window (tokens)
    overlong_penalty_factor: float = 1.0


@dataclass(kw_only=True)
class RunConfig:
    """The whole run: one field per config group plus the global seed and the preset's name."""

    model: ModelConfig = MISSING
    teacher: Optional[ModelConfig] = None  # on-policy distillation's teacher (a model option: model@teacher=NAME)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    algo: AlgoConfig = MISSING
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rollout: RolloutConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    seed: int = 1234
    # The conf/preset option the run's stack and sizes come from (a label: choose one with preset=NAME).
    preset: Optional[str] = None
