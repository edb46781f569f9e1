"""Typed schemas of the run's bookkeeping groups: eval, checkpoint, logger, paths, debug (its fault injection
parsed into `PhasePoint`s of `RUN_PHASES`) and the runtime watchdog. Re-exported by `slime.config.schema`,
the run's schema in one place. Units are stated per field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from slime.config.input_kinds import MODEL_CHECKPOINT, PATH_READ, PATH_WRITTEN


@dataclass(kw_only=True)
class EvalDatasetConfig:
    """One named eval dataset (`eval.datasets.<name>`); a null field takes the eval default, then the rollout's."""

    prompt_data: str = field(
        default=MISSING, metadata=PATH_READ
    )  # .jsonl or .parquet (row slices `path@[start:end]` allowed)
    input_key: Optional[str] = None  # default: data.input_key (likewise label_key, metadata_key)
    label_key: Optional[str] = None
    metadata_key: Optional[str] = None
    n_samples_per_prompt: Optional[int] = None  # default: eval.n_samples_per_prompt
    temperature: Optional[float] = None  # sampling: default eval.*, then rollout.*
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    max_response_len: Optional[int] = None  # tokens
    rm_type: Optional[str] = None  # default: rollout.rm_type
    reward_key: Optional[str] = None  # the scalar of dict rewards; default: rollout.reward_key
    generator: Optional[Any] = None  # like data.generator


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out evaluation every `interval` rollout steps over named datasets, each with its own overrides."""

    interval: Optional[int] = None  # rollout steps between evals; None disables eval
    skip_eval_before_train: bool = False
    function: Optional[Any] = None  # like rollout.function, called with evaluation=True; None: rollout.function
    # Defaults of every dataset (a dataset's own value wins; null: the rollout's)
    n_samples_per_prompt: int = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    max_response_len: Optional[int] = None
    # name -> EvalDatasetConfig fields. Typed as Any so that `+eval.datasets.<name>.prompt_data=...` can add one
    # from the command line (OmegaConf cannot add keys to a dict of dataclasses); validation checks each entry.
    datasets: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class CheckpointConfig:
    """Where checkpoints are loaded from and saved to, and how often (docs/checkpoints.md)."""

    load: Optional[str] = field(default=None, metadata=PATH_READ)  # resume from this checkpoint root
    ref_load: Optional[str] = field(default=None, metadata=MODEL_CHECKPOINT)  # reference model (HF dir)
    save: Optional[str] = field(default=None, metadata=PATH_WRITTEN)  # default: <run dir>/checkpoints
    save_interval: Optional[int] = None  # rollout steps; None saves only at the end
    ckpt_step: Optional[int] = None  # rollout id to load; default: latest
    # HF export (safetensors + config + tokenizer) at every checkpoint save, like slime's --save-hf: a directory
    # template that must contain "{rollout_id}" (str.format field, e.g. /ckpt/hf/iter_{rollout_id:07d}), so no
    # save overwrites another. None: no export.
    save_hf: Optional[str] = field(default=None, metadata=PATH_WRITTEN)
    no_save_optim: bool = False
    # auto: continue from the latest complete checkpoint under checkpoint.save (its tracker file), if there is one;
    # else start afresh. null: only checkpoint.load resumes.
    resume: Optional[str] = None
    # a resume whose data.prompt_data differs from the one the checkpoint was saved with (its sha256 is saved with
    # the data source's state) is refused unless true: the saved cursor would draw other prompts
    allow_data_change: bool = False


@dataclass(kw_only=True)
class WandbConfig:
    """The wandb run: mode, project, entity, group, name, tags."""

    mode: str = "auto"  # online | offline | disabled | auto (offline without an API key)
    project: str = "slime"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    # Tracking naming (slime.tracking.naming): None derives it. group: the sweep, else the experiment (recipe, or
    # model-algo); name: the overrides; id: <experiment>-<hash of the run dir>, or the one stored with checkpoint.load
    id: Optional[str] = None
    notes: Optional[str] = None


@dataclass(kw_only=True)
class LoggerConfig:
    """Metric sinks and what the console and run directory show."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    # What the terminal shows (slime/driver/console.py): plain (the plan summary, one line per rollout step, on a
    # terminal a live display below them, warnings and errors, the end summary; everything else in <run dir>/main.log
    # and logs/) or verbose (also the resolved config, every log record and the Ray workers' output)
    console: str = "plain"
    progress: bool = True  # the live display on a terminal, and the rollouts' group counts
    # off a terminal: main.log records of the phases slower than this, and of the group counts this often
    progress_every_s: float = 10.0
    plot: bool = True  # PNG plots in the run dir at each save and at the end of the run
    log_samples: int = 4  # samples per rollout written to samples.jsonl
    log_samples_every: Optional[int] = 10  # rollouts between wandb tables of sampled generations; None: never
    tensorboard: bool = (
        False  # also write TensorBoard event files to <run dir>/tensorboard (pip install .[tensorboard])
    )
    # Metric whose last value the run returns to a sweeper (slime/config/objective.py); null: the
    # last eval mean, or the last rollout/raw_reward without eval.
    objective: Optional[str] = None


@dataclass(kw_only=True)
class PathsConfig:
    """Absolute locations resolved once on the driver."""

    root_dir: str = MISSING  # the project checkout
    cache_dir: str = field(default=MISSING, metadata=PATH_WRITTEN)  # generated models and data
    output_dir: str = field(default=MISSING, metadata=PATH_WRITTEN)  # this run's directory (Hydra's output dir)


@dataclass(kw_only=True)
class DebugConfig:
    """Logging and the fault injection the tests use."""

    log_level: str = "INFO"
    ray_log_to_driver: bool = True
    # Fault injection for the signal path: send `signal` to the driver when it enters this phase
    # ("PHASE" or "PHASE:ROLLOUT_ID"; the initial weight push and eval are rollout -1). Phases: RUN_PHASES.
    signal_at: Optional[str] = None
    signal: str = "SIGINT"  # SIGINT | SIGTERM | SIGKILL (kills every process of the run at once: a crash)
    signal_delay_s: float = 0.0  # seconds after entering the phase
    # Fault injection for the watchdog: on entering this phase ("PHASE" or "PHASE:ROLLOUT_ID"; a save: once its
    # data-source state is written) the driver makes training rank 0 sleep forever and waits for it
    hang_at: Optional[str] = None
    # Fault injection for train.on_nonfinite: on entering this train phase ("train" or "train:ROLLOUT_ID") every
    # training rank gives its first trainable parameter a NaN gradient in that step's first backward
    nonfinite_at: Optional[str] = None
    # Fault injection for fault tolerance: on entering this phase ("PHASE" or "PHASE:ROLLOUT_ID") the driver
    # SIGKILLs engine 0's server process (its pid from engines.json), as an out-of-memory kill would; weight_sync:
    # as the push begins moving weights
    kill_engine_at: Optional[str] = None
    # Likewise for the router the run launched (its pid from engines.json)
    kill_router_at: Optional[str] = None
    # Fault injection for verified syncs: the push of this weight version flips one byte of its first tensor after
    # the trainer digested it, once (rollout.weight_sync.verify must find it; on_mismatch=resync pushes again)
    corrupt_push_version: Optional[int] = None
    # slime's --check-weight-update-equal, through SGLang's /weights_checker (SGLang or the hf engine): the engines
    # snapshot the checkpoint's weights and randomise them once up; the first push of a fresh run must restore
    # every tensor bit-exact, and after every push engines of one layout must agree (fails the run otherwise)
    check_weight_update_equal: bool = False
    # Write each rollout's trained samples to <run dir>/rollout_data/<rollout_id>.jsonl (slime.rollout.dumps)
    save_rollout_data: bool = False
    load_rollout_data: Optional[str] = field(
        default=None, metadata=PATH_READ
    )  # a rollout_data/ directory: train from its dumps, no engines
    # Debug modes (conf/debug/): rollout_only starts no trainer (the engines generate with model.hf_checkpoint's
    # weights, rewards and rollout metrics are logged, nothing trained or saved: for tuning engines);
    # train_only starts no engines and trains from debug.load_rollout_data's dumps (required)
    rollout_only: bool = False
    train_only: bool = False
    # Compose, validate, print the placement plan, batch arithmetic and per-GPU memory estimate, then exit 0 without
    # starting anything (debug=dry_run; slime.plan.dry_run)
    dry_run: bool = False
    gpu_memory_gib: Optional[float] = (
        None  # GPU size the dry run's memory estimate is checked against (None: nvidia-smi, else 80)
    )


# The driver's phases, as result.json names them (`phase`) and debug.signal_at/hang_at select them.
RUN_PHASES = ("prepare", "startup", "weight_sync", "eval", "rollout", "log_probs", "train", "save", "teardown")


@dataclass(frozen=True, kw_only=True)
class PhasePoint:
    """`debug.signal_at`/`debug.hang_at` parsed: a phase of RUN_PHASES, of one rollout id or (None) of any."""

    phase: str
    rollout_id: Optional[int] = None

    @classmethod
    def parse(cls, value: str) -> PhasePoint:
        """ "PHASE" or "PHASE:ROLLOUT_ID"; ValueError saying the expected form otherwise."""
        phase, _, rollout_id = value.partition(":")
        if phase not in RUN_PHASES or (rollout_id and not rollout_id.lstrip("-").isdigit()):
            raise ValueError(f"must be PHASE or PHASE:ROLLOUT_ID with PHASE one of {list(RUN_PHASES)}")
        return cls(phase=phase, rollout_id=int(rollout_id) if rollout_id else None)

    def matches(self, phase: str, rollout_id: Optional[int]) -> bool:
        return phase == self.phase and (self.rollout_id is None or self.rollout_id == rollout_id)


@dataclass(kw_only=True)
class RuntimeConfig:
    """The driver's watchdog (slime.driver.watchdog)."""

    # A phase (RUN_PHASES, teardown excepted) running longer than this many seconds: every actor's Python stacks
    # are dumped to <run dir>/stacks/<pid>.txt, result.json says status "hung" and names the phase, the run is
    # torn down and exits 3. None: no limit.
    phase_timeout_s: Optional[float] = None
    # The startup phase's own limit (Ray, the trainer's model load, the engines' launch: often far longer than a
    # step). None: phase_timeout_s applies to startup too.
    startup_timeout_s: Optional[float] = None
