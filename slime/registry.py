"""One registry per seam, filled by the parts themselves: each pluggable part declares its records in a torch-free
`spec.py` beside its code (`SPECS`: `Spec`s naming their class relative to their own package, their facts and their
checks), and this module only finds those files and reads them. It names no part.

    TRAIN_BACKENDS       parallelism.backend       slime/train/{fsdp,megatron}/spec.py
    ENGINES              rollout.engine            slime/engine/{hf,sglang,vllm}/spec.py
    WEIGHT_SYNC          rollout.weight_sync.mode  slime/sync/spec.py
    REWARD_TYPES         rollout.rm_type           slime/rollout/spec.py
    ROLLOUT_FUNCTIONS    rollout.function          slime/rollout/spec.py
    TOOL_PARSERS         rollout.agent.tool_parser slime/rollout/spec.py
    ADVANTAGE_ESTIMATORS algo.advantage_estimator  slime/algo/spec.py (records: slime.algo.estimators)
    MODEL_FAMILIES       model.architecture        slime/models/spec.py (records: slime.models.families)

A spec module imports no torch, Ray or engine (its checks are torch-free functions, its classes are named by their
path relative to its package and imported on first use), so validation, `python main.py --help` and error messages
list every name without importing them. A part outside the project registers the same way: a config value that is
the import path of a package with a `spec.py` (`rollout.engine=my_engines.fast`) chooses that package's record.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from slime.config.hooks import load_callable

Check = Callable[[Any], Iterable[Any]]  # fn(cfg: RunConfig) -> Iterable[Problem]
MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checks:
    """A record's checks (None: nothing to check); slime/plan/validate.py runs them."""

    check: Optional[Check] = None  # run when the config chooses the record
    check_unchosen: Optional[Check] = None  # run when it chooses another record of the same registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
    """One part's record. `seam`: the config key choosing among its registry's records; `target`: the part's
    class or function, or {role: target} (train backends: actor, critic), each a path relative to `package` (the
    spec module's package: `.engine.HFEngine`) or absolute; `facts`: its registry's facts record (a string fact
    starting with "." is a path relative to `package` too); `checks`: its checks; `config`: the dataclass of its own
    options (a torch-free module beside it), whose fields join the config node holding `seam` (the built-in engine's
    `hf` joins `rollout`: `rollout.hf`), or None (slime/run_schema.py builds the run's schema with them)."""

    seam: str
    name: str
    target: Any
    facts: Any = None
    checks: Checks = Checks()
    config: Optional[type] = None
    package: str = ""

    def absolute(self, path: str) -> str:
        """`path` made absolute against the spec's package (absolute paths are returned as they are)."""
        return f"{self.package}{path}" if path.startswith(".") else path


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """What code outside an engine's package needs to know of it, read without importing the engine."""

    kind: str = ""  # what it is, in a few words (the dry run and the plan summary); empty: its import path
    router: str = "sglang-router"  # the router launched in front of its servers
    abort_path: str = "/abort_request"  # POSTed to every worker to abort all requests in flight
    abort_all_flag: bool = True  # the abort's JSON body is {"abort_all": true} (else {})
    # Path of the module translating SGLang's /generate to the servers' own endpoint (GENERATE_PATH,
    # generate_payload, as_sglang_output; relative to the spec's package in a spec); None: SGLang's /generate.
    generate_protocol: Optional[str] = None
    prefill_decode_groups: bool = False  # rollout.vllm.prefill_num_servers splits its servers into prefill/decode
    # `section.option` of rollout: the fraction of device memory a server fills (weights, then KV cache), and
    # the server's own default; None: the memory estimate counts the KV cache of its concurrent sequences.
    memory_fraction_key: Optional[str] = None
    memory_fraction_default: float = 0.0
    # Path of fn(cfg, engine_specs) -> str: the dry run's line on how its servers split their GPUs.
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
    # Its servers write a delta push's changed bits into their weights (`<name>@delta.gaps` / `@delta.values` pairs in
    # a bucket: slime.sync.delta); False: it loads whole tensors only.
    applies_weight_deltas: bool = False
    # `section.option` of rollout naming the dtype its servers compute in; None: the trainer's precision, which the
    # launch hands them.
    dtype_key: Optional[str] = None
    # Its servers finish copying a tensor-mode bucket in before replying and keep the buffers they opened mapped
    # (`keep_mapping`: slime.wire.kept_mappings), so a push reuses two staging buffers for every bucket
    # (slime.sync.staging); False: a fresh buffer per bucket (SGLang copies asynchronously after its reply).
    reuses_tensor_buffers: bool = False


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
    # Path of the class that moves the policy's LoRA adapter alone in this mode (None: the mode moves full
    # weights only, and a LoRA run syncs the merged weights: model.lora.sync_merged).
    adapter_sync: Optional[str] = None
    # Its adapter sync has every engine check each adapter tensor it loaded (debug.check_weight_update_equal).
    checks_adapters: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class EstimatorFacts:
    """What differs between advantage estimators beyond their functions, read without importing torch.

    needs_critic: a value model is trained alongside (its values feed the token advantages).
    needs_old_log_probs: the loss reads ℓ_old beyond stopgrad(ℓ), so a forward-only pass computes it even
        with one optimizer step per rollout.
    reward_kl: KL goes in the reward (algo.kl_coef shapes the advantages); the others take KL only as a
        loss term (algo.use_kl_loss).
    needs_whitening: advantages are meaningful only whitened (algo.normalize_advantages must be true).
    uses_advantages: the policy loss reads advantages (whitening them is skipped otherwise).
    generates: the policy generates the responses it learns from; False (SFT) reads them from the data,
        so there are no engine log-probs, no reward and nothing to evaluate.
    min_samples_per_prompt: the smallest rollout.n_samples_per_prompt the reward transform accepts.
    rollout_function: the `rollout.function` registry name used when rollout.function is null.
    """

    needs_critic: bool = False
    needs_old_log_probs: bool = False
    reward_kl: bool = False
    needs_whitening: bool = False
    uses_advantages: bool = True
    generates: bool = True
    min_samples_per_prompt: int = 1
    rollout_function: str = "default"


class Registry:
    """Names -> the records (`Spec`) of one seam, chosen by the config key `key`; `what` names a record in messages,
    `default_facts` is the facts of a record that states none. Filled on first use from every `spec.py` under
    slime/ (`specs`), and by `register` (a test's part)."""

    def __init__(self, key: str, *, what: str, default_facts: Any = None):
        self.key = key
        self.what = what
        self._default_facts = default_facts
        self._added: dict[str, Optional[Spec]] = {}  # registered (a Spec) or unregistered (None) by hand

    @property
    def _specs(self) -> dict[str, Spec]:
        found = {spec.name: spec for spec in specs() if spec.seam == self.key}
        found.update(self._added)
        return {name: spec for name, spec in found.items() if spec is not None}

    def register(self, spec: Spec) -> None:
        """Add (or replace) `spec` under its name."""
        self._added[spec.name] = spec

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's registration); KeyError if it is not registered."""
        if name not in self._specs:
            raise KeyError(name)
        self._added[name] = None

    def spec(self, name: str) -> Spec:
        """The record of `name`: a registered name, or the import path of a package outside slime whose spec.py
        declares one record of this seam; ValueError naming the choices otherwise."""
        found = self._specs.get(name) or _outside_spec(self.key, name)
        if found is None:
            raise ValueError(self.unknown_message(name))
        return found

    def facts(self, name: str) -> Any:
        """The record of facts registered for `name`; ValueError naming the choices for an unknown name."""
        facts = self.spec(name).facts
        return facts if facts is not None else self._default_facts

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._specs or _outside_spec(self.key, name) is not None)

    def target(self, name: str, role: str | None = None) -> str:
        """The absolute import path registered for `name` (and `role`); ValueError naming the choices otherwise."""
        spec = self.spec(name)
        if role is None:
            return spec.absolute(spec.target) if isinstance(spec.target, str) else spec.target
        if role not in spec.target:
            raise ValueError(f"{self.key}={name!r} has no {role} {self.what}; it provides {sorted(spec.target)}")
        return spec.absolute(spec.target[role])

    def load(self, name: str, role: str | None = None) -> Any:
        """Import and return the registered object."""
        return load_callable(self.target(name, role), key=self.key)

    def checks(self, name: str) -> Checks:
        """The checks registered for `name` (none for a name registered without them)."""
        spec = self._specs.get(name)
        return spec.checks if spec is not None else Checks()

    def roles(self, name: str) -> list[str]:
        spec = self._specs.get(name)
        return sorted(spec.target) if spec is not None and isinstance(spec.target, dict) else []

    def unknown_message(self, name: object) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; registered: {', '.join(self.names())}"


def spec_modules() -> list[str]:
    """The module name of every spec.py under slime/, sorted."""
    root = Path(__file__).parent
    return sorted(".".join((root.name, *p.relative_to(root).with_suffix("").parts)) for p in root.rglob("spec.py"))


@functools.cache
def specs() -> tuple[Spec, ...]:
    """Every record the project's parts declare (their spec modules' SPECS), each with its package set."""
    return tuple(spec for module in spec_modules() for spec in _declared(importlib.import_module(module)))


def _declared(module: ModuleType) -> Iterator[Spec]:
    package = module.__name__.rpartition(".")[0]
    for spec in getattr(module, "SPECS", ()):
        facts = spec.facts
        if dataclasses.is_dataclass(facts):
            relative = {f.name: getattr(facts, f.name) for f in dataclasses.fields(facts)}
            relative = {k: f"{package}{v}" for k, v in relative.items() if isinstance(v, str) and v.startswith(".")}
            facts = dataclasses.replace(facts, **relative)
        yield dataclasses.replace(spec, facts=facts, package=package)


@functools.cache
def _outside_spec(seam: str, path: str) -> Optional[Spec]:
    """The record of `seam` a package outside slime declares in its spec.py, under the package's import path; None
    when there is no such package or it has no spec.py; ValueError saying why when its spec.py does not import or
    declares other than one record of `seam`."""
    if not MODULE_PATH.match(path) or path.split(".")[0] == "slime":
        return None
    module_name = f"{path}.spec"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):  # the package, or its spec.py, is absent
            return None
        raise ValueError(f"{module_name} does not import: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's spec.py: whatever it raises is reported, not a traceback
        raise ValueError(f"{module_name} does not import: {type(exc).__name__}: {exc}") from exc
    found = [spec for spec in _declared(module) if spec.seam == seam]
    if len(found) != 1:
        raise ValueError(f"{module_name} declares {len(found)} records of {seam} in its SPECS; it must declare one")
    return dataclasses.replace(found[0], name=path)


TRAIN_BACKENDS = Registry("parallelism.backend", what="training backend", default_facts=TrainBackendFacts())
ENGINES = Registry("rollout.engine", what="rollout engine", default_facts=EngineFacts())
WEIGHT_SYNC = Registry("rollout.weight_sync.mode", what="weight-sync mode", default_facts=WeightSyncFacts())
REWARD_TYPES = Registry("rollout.rm_type", what="reward type")
ROLLOUT_FUNCTIONS = Registry("rollout.function", what="rollout function")
TOOL_PARSERS = Registry("rollout.agent.tool_parser", what="tool-call parser")
ADVANTAGE_ESTIMATORS = Registry("algo.advantage_estimator", what="advantage estimator", default_facts=EstimatorFacts())
MODEL_FAMILIES = Registry("model.architecture", what="model family")


def generate_protocol(engine: str) -> Optional[ModuleType]:
    """The module translating SGLang's /generate for `engine`'s servers (EngineFacts.generate_protocol), or None."""
    path = ENGINES.facts(engine).generate_protocol
    return importlib.import_module(path) if path else None


# The registries `--help` lists and validation walks (slime/plan/validate.py walks MODEL_FAMILIES too)
ALL = (TRAIN_BACKENDS, ENGINES, WEIGHT_SYNC, REWARD_TYPES, ROLLOUT_FUNCTIONS, TOOL_PARSERS, ADVANTAGE_ESTIMATORS)
