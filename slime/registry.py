"""One registry per seam: the names a config may choose, each mapped to an import path.

    TRAIN_BACKENDS   parallelism.backend        "fsdp" -> {"actor": class path, "critic": class path}
    ENGINES          rollout.engine             "hf" -> engine class path
    WEIGHT_SYNC      rollout.weight_sync.mode   "disk" -> weight-sync class path
    REWARD_TYPES     rollout.rm_type            "math" -> fn(response, label, metadata) path
    ROLLOUT_FUNCTIONS rollout.function          "default" -> rollout function path
    TOOL_PARSERS     rollout.agent.tool_parser  "qwen25" -> tool-call parser class path

The advantage estimators (algo.advantage_estimator) are records holding their functions, not import paths:
their registry is slime.algo.estimators.ESTIMATORS, listed here beside the others.

Entries are import paths (`package.module.attr`), resolved on first use through the one loader of user
code (`slime.config.hooks.load_callable`), so validation can list every name without importing Ray or an
engine (the estimator records bring torch). Validation, `python main.py --help` and
error messages take their names from here; a later issue adds a backend or an engine with one line.

Each record may also name its checks (import paths of `fn(cfg: RunConfig) -> Iterable[Problem]`, modules
that import no torch, Ray or engine at module level), which the validation walker (slime/plan/validate.py)
runs: `check` when the config chooses the record, `check_unchosen` when it chooses another one (options
this part owns that the run sets although another part was chosen).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from types import ModuleType
from typing import Any, Optional

from omegaconf import OmegaConf

from slime.algo.estimators import ESTIMATORS
from slime.config.hooks import load_callable


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checks:
    """Import paths of a record's checks (None: nothing to check)."""

    check: Optional[str] = None  # run when the config chooses the record
    check_unchosen: Optional[str] = None  # run when it chooses another record of the same registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """What code outside an engine's package needs to know of it, read without importing the engine."""

    kind: str = ""  # what it is, in a few words (the dry run and the plan summary); empty: its import path
    router: str = "sglang-router"  # the router launched in front of its servers
    abort_path: str = "/abort_request"  # POSTed to every worker to abort all requests in flight
    abort_all_flag: bool = True  # the abort's JSON body is {"abort_all": true} (else {})
    # Import path of the module translating SGLang's /generate to the servers' own endpoint (GENERATE_PATH,
    # generate_payload, as_sglang_output); None: the servers answer SGLang's /generate.
    generate_protocol: Optional[str] = None
    prefill_decode_groups: bool = False  # rollout.vllm.prefill_num_servers splits its servers into prefill/decode
    # `section.option` of rollout: the fraction of device memory a server fills (weights, then KV cache), and
    # the server's own default; None: the memory estimate counts the KV cache of its concurrent sequences.
    memory_fraction_key: Optional[str] = None
    memory_fraction_default: float = 0.0
    # Import path of fn(cfg, engine_specs) -> str: the dry run's line on how its servers split their GPUs.
    plan_line: Optional[str] = None
    # The weight-sync modes in which its servers load the policy's LoRA adapter at run time and serve the requests
    # naming it (SGLang's --enable-lora: /load_lora_adapter_from_tensors in tensor mode, /load_lora_adapter in disk
    # mode, generate's lora_path); empty: it serves merged weights only (model.lora.sync_merged).
    lora_adapter_modes: tuple[str, ...] = ()
    # Its /weights_checker hashes a tensor on a GPU with a hash of its own (SGLang's triton `gpu_tensor_hash`), which
    # the trainer cannot reproduce: an adapter sync cannot check the trained base weights it moved on such a server.
    gpu_weight_checksums: bool = False
    # Its servers' multi-node flags (node count, node rank, the first node's rendezvous address): an engine wider
    # than a node runs one server process per node slice (SGLang's --nnodes / --node-rank / --dist-init-addr);
    # None: each server stays inside one node.
    node_span_flags: Optional[tuple[str, str, str]] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainBackendFacts:
    """What code outside a backend's package needs to know of it, read without importing it."""

    kind: str = ""  # what it is, in a few words (the dry run and the plan summary); empty: its import path
    # Weights, gradients and optimizer state sharded over every data-parallel x TP rank (FSDP's memory model);
    # False: megatron's (dense over TP x PP, experts over EP x ETP x PP, optimizer over the data-parallel ranks).
    fully_sharded_state: bool = False
    # The frozen models (reference, distillation teacher) sit on the GPU beside the policy (fsdp: whole models,
    # train.ref_offload moves them to the CPU between forwards); False: host copies of this rank's parameters swapped
    # into the policy's own tensors for their forward (slime.train.megatron.backend), no GPU memory of their own.
    frozen_models_on_gpu: bool = False
    # The `parallelism` key (dotted) and the value with which the backend recomputes every layer in its backward,
    # keeping only the layer inputs (fsdp: gradient_checkpointing; megatron: recompute.granularity=full).
    full_recompute: tuple[str, Any] = ("gradient_checkpointing", True)
    # The `parallelism` key and value under which a bf16 run holds a LoRA policy's frozen base in bf16 (fsdp: FSDP2's
    # bf16 policy, slime.train.fsdp.rank `_base_dtype`); None: the base's dtype is the backend's usual weights'.
    bf16_lora_base: Optional[tuple[str, Any]] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightSyncFacts:
    """What code outside slime/sync needs to know of a weight-sync mode, read without importing it."""

    # Engine TP rank i opens the in-memory handle of training rank tp_trainer_ranks[i] (on its own device).
    needs_tensor_handle_ranks: bool = False
    # Why a server without an accelerator cannot take this mode's syncs (None: it can).
    cpu_blocker: Optional[str] = "its weight-transfer engine needs an accelerator"
    # Import path of the class that moves the policy's LoRA adapter alone in this mode (None: the mode moves full
    # weights only, and a LoRA run syncs the merged weights: model.lora.sync_merged).
    adapter_sync: Optional[str] = None
    # Its adapter sync has every engine check each adapter tensor it loaded (debug.check_weight_update_equal).
    checks_adapters: bool = False


class Registry:
    """Names -> import paths for one seam, chosen by the config key `key`.

    A value is an import path string, or a dict of role -> import path (train backends: actor, critic).
    `facts` holds a small frozen record per name (EngineFacts, WeightSyncFacts) that code outside the
    chosen thing's package reads instead of comparing its name; a name without one gets `default_facts`.
    """

    def __init__(
        self,
        key: str,
        entries: dict[str, Any],
        *,
        what: str,
        checks: Optional[dict[str, Checks]] = None,
        facts: Optional[dict[str, Any]] = None,
        default_facts: Any = None,
    ):
        self.key = key
        self.what = what
        self._entries = dict(entries)
        self._checks = dict(checks or {})
        self._facts = dict(facts or {})
        self._default_facts = default_facts

    def register(self, name: str, target: Any, *, checks: Optional[Checks] = None, facts: Any = None) -> None:
        """Add (or replace) `name`; `target` is an import path or a role -> import path dict; `checks` its
        checks; `facts` its record (None: the registry's default)."""
        self._entries[name] = target
        self._checks[name] = checks or Checks()
        self._facts[name] = facts if facts is not None else self._default_facts

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's registration); KeyError if it is not registered."""
        del self._entries[name]
        self._checks.pop(name, None)
        self._facts.pop(name, None)

    def facts(self, name: str) -> Any:
        """The record of facts registered for `name`; ValueError naming the choices for an unknown name."""
        if name not in self._entries:
            raise ValueError(self.unknown_message(name))
        return self._facts.get(name, self._default_facts)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def target(self, name: str, role: str | None = None) -> str:
        """The import path registered for `name` (and `role`); ValueError naming the choices otherwise."""
        if name not in self._entries:
            raise ValueError(self.unknown_message(name))
        entry = self._entries[name]
        if role is None:
            return entry
        if role not in entry:
            raise ValueError(f"{self.key}={name!r} has no {role} {self.what}; it provides {sorted(entry)}")
        return entry[role]

    def load(self, name: str, role: str | None = None) -> Any:
        """Import and return the registered object."""
        return load_callable(self.target(name, role), key=self.key)

    def checks(self, name: str) -> Checks:
        """The checks registered for `name` (none for a name registered without them)."""
        return self._checks.get(name, Checks())

    def roles(self, name: str) -> list[str]:
        entry = self._entries.get(name)
        return sorted(entry) if isinstance(entry, dict) else []

    def unknown_message(self, name: object) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; registered: {', '.join(self.names())}"


TRAIN_BACKENDS = Registry(
    "parallelism.backend",
    {
        "fsdp": {"actor": "slime.train.fsdp.backend.FSDPBackend", "critic": "slime.train.fsdp.critic.FSDPCritic"},
        "megatron": {
            "actor": "slime.train.megatron.backend.MegatronBackend",
            "critic": "slime.train.megatron.critic.MegatronCritic",
        },
    },
    what="training backend",
    facts={
        "fsdp": TrainBackendFacts(
            kind="PyTorch FSDP2 over a transformers model",
            fully_sharded_state=True,
            frozen_models_on_gpu=True,
            bf16_lora_base=("fsdp.mixed_precision", "fsdp2"),
        ),
        "megatron": TrainBackendFacts(kind="Megatron-core GPTModel", full_recompute=("recompute.granularity", "full")),
    },
    default_facts=TrainBackendFacts(),
    checks={
        "fsdp": Checks(check="slime.train.fsdp.check.check", check_unchosen="slime.train.fsdp.check.check_unchosen"),
        "megatron": Checks(
            check="slime.train.megatron.config_check.check",
            check_unchosen="slime.train.megatron.config_check.check_unchosen",
        ),
    },
)

ENGINES = Registry(
    "rollout.engine",
    {
        "hf": "slime.engine.hf.engine.HFEngine",
        "sglang": "slime.engine.sglang.engine.SGLangEngine",
        "vllm": "slime.engine.vllm.engine.VLLMEngine",
    },
    what="rollout engine",
    checks={
        "hf": Checks(check="slime.engine.hf.check.check"),
        "sglang": Checks(
            check="slime.engine.sglang.check.check", check_unchosen="slime.engine.sglang.check.check_unchosen"
        ),
        "vllm": Checks(check="slime.engine.vllm.check.check", check_unchosen="slime.engine.vllm.check.check_unchosen"),
    },
    facts={
        "hf": EngineFacts(kind="built-in transformers server", lora_adapter_modes=("tensor", "disk")),
        "sglang": EngineFacts(
            kind="SGLang servers",
            memory_fraction_key="sglang.mem_fraction_static",
            memory_fraction_default=0.8,
            lora_adapter_modes=("tensor", "disk"),
            gpu_weight_checksums=True,
            node_span_flags=("--nnodes", "--node-rank", "--dist-init-addr"),
        ),
        "vllm": EngineFacts(
            kind="vLLM servers",
            router="vllm-router",
            abort_path="/abort_requests",
            abort_all_flag=False,
            generate_protocol="slime.engine.vllm.protocol",
            prefill_decode_groups=True,
            # vLLM 0.32.0 CacheConfig.gpu_memory_utilization
            memory_fraction_key="vllm.gpu_memory_utilization",
            memory_fraction_default=0.92,
            plan_line="slime.engine.vllm.engine_args.plan_line",
            lora_adapter_modes=("disk",),  # /v1/load_lora_adapter reads a peft directory; no route takes tensors
            node_span_flags=("--nnodes", "--node-rank", "--master-addr/--master-port"),  # node ranks >= 1 --headless
        ),
    },
    default_facts=EngineFacts(),
)

WEIGHT_SYNC = Registry(
    "rollout.weight_sync.mode",
    {
        "disk": "slime.sync.disk.DiskWeightSync",
        "tensor": "slime.sync.tensor.TensorWeightSync",
        "distributed": "slime.sync.distributed.DistributedWeightSync",
    },
    what="weight-sync mode",
    checks={
        "disk": Checks(check_unchosen="slime.sync.check.check_disk_unchosen"),
        "tensor": Checks(check="slime.sync.check.check_tensor"),
        "distributed": Checks(check="slime.sync.check.check_distributed"),
    },
    facts={
        "disk": WeightSyncFacts(cpu_blocker=None, adapter_sync="slime.sync.adapter.DiskAdapterSync"),
        "distributed": WeightSyncFacts(),
        "tensor": WeightSyncFacts(
            needs_tensor_handle_ranks=True,
            cpu_blocker="its IPC transfer and sleep mode need an accelerator",
            adapter_sync="slime.sync.adapter.TensorAdapterSync",
            checks_adapters=True,
        ),
    },
    default_facts=WeightSyncFacts(),
)

REWARD_TYPES = Registry(
    "rollout.rm_type",
    {
        "last_number": "slime.rollout.tool_use.last_number_reward",
        "exact_match": "slime.rollout.rewards.exact_match",
        "first_word": "slime.rollout.rewards.first_word",
        "math": "slime.rollout.rm.math.math_reward",
        "deepscaler": "slime.rollout.rm.math.deepscaler_reward",
        "dapo": "slime.rollout.rm.math.dapo_reward",
        "f1": "slime.rollout.rm.qa.f1_reward",
        "gpqa": "slime.rollout.rm.qa.gpqa_reward",
        "remote_rm": "slime.rollout.rm.remote.RemoteRewardModel",  # the hub builds it from rollout.rm_url
    },
    what="reward type",
    checks={"remote_rm": Checks(check="slime.rollout.check_rewards.check_remote_rm")},
)

ROLLOUT_FUNCTIONS = Registry(
    "rollout.function",
    {
        "default": "slime.rollout.default.generate_rollout",
        "sft": "slime.rollout.sft.generate_rollout",
    },
    what="rollout function",
)


TOOL_PARSERS = Registry(
    "rollout.agent.tool_parser",
    {
        "qwen25": "slime.rollout.agent.tool_calls.Qwen25Calls",
        "tiny": "slime.rollout.agent.tool_calls.TinyCalls",
    },
    what="tool-call parser",
)


def generate_protocol(engine: str) -> Optional[ModuleType]:
    """The module translating SGLang's /generate for `engine`'s servers (EngineFacts.generate_protocol), or None."""
    path = ENGINES.facts(engine).generate_protocol
    return importlib.import_module(path) if path else None


ALL = (TRAIN_BACKENDS, ENGINES, WEIGHT_SYNC, REWARD_TYPES, ROLLOUT_FUNCTIONS, TOOL_PARSERS)


def listing() -> str:
    """One line per seam: the config key and its registered names (for `--help`)."""
    return "\n".join(f"  {r.key:<26} {', '.join(r.names())}" for r in (*ALL, ESTIMATORS))


def register_listing_resolver() -> None:
    """Idempotent: `${slime_registry:}` in conf/ (the --help text) lists the registered names."""
    if not OmegaConf.has_resolver("slime_registry"):
        OmegaConf.register_new_resolver("slime_registry", listing)
