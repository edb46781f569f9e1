"""`SGLangEngine`: one SGLang server (`python -m sglang.launch_server ...`) as an `EngineServer`.

The command line is SGLang's own CLI, rendered from the actions its parser registers
(`server_args.server_args_cli`): the fields the framework owns (`server_args.OWNED_FIELDS`: model path, tp
size, host and the reserved ports, seed, memory saver, ...) from the launch, then the framework's defaults
overridden by every `rollout.sglang` field and the server group's overrides. The server runs with the
engine's GPUs as CUDA_VISIBLE_DEVICES (so base_gpu_id is 0), without PYTORCH_CUDA_ALLOC_CONF or its newer
name PYTORCH_ALLOC_CONF (expandable segments break SGLang's memory saver) and with NCCL_CUMEM_ENABLE=0
(docs/architecture.md#launching-an-sglang-server).

Nothing here imports sglang: the server is a child process. `launch_module` swaps the entry point for a
server that parses the same CLI (the CPU tests' fake, `tests/fakes/fake_sglang.py`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any, ClassVar

from slime.engine.base import EngineLaunch, EngineServer
from slime.engine.sglang.server_args import server_args_cli

if TYPE_CHECKING:
    from slime.config.schema import RolloutConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGLangEngineConfig:
    """What one SGLang server is started with besides its `EngineLaunch`."""

    server_args: dict[str, Any]  # ServerArgs fields (rollout.sglang + the group's overrides), already validated
    launch_module: str = "sglang.launch_server"
    startup_timeout_s: float = 600.0
    deterministic: bool = False  # rollout.deterministic -> --enable-deterministic-inference
    worker_type: str = "regular"  # regular | prefill | decode (PD disaggregation)


class SGLangEngine(EngineServer):
    """One SGLang server over `len(launch.gpu_ids)` GPUs (tp_size = that count / pp_size), or one node's server of an
    engine spanning nodes (`launch.node_slice`: tp_size counts every node's GPUs)."""

    kind = "sglang"
    num_ports: ClassVar[int] = 3  # HTTP, NCCL, PD bootstrap
    unset_env = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

    def __init__(self, launch: EngineLaunch, config: SGLangEngineConfig):
        super().__init__(launch, config)

    @classmethod
    def config_from(
        cls, rollout: RolloutConfig, *, worker_type: str = "regular", overrides: dict | None = None
    ) -> SGLangEngineConfig:
        """`rollout.sglang` with the server group's `overrides` on top, and the group's worker type."""
        return SGLangEngineConfig(
            server_args={**rollout.sglang, **(overrides or {})},
            launch_module=rollout.sglang_launch.module,
            startup_timeout_s=rollout.sglang_launch.startup_timeout_s,
            deterministic=rollout.deterministic,
            worker_type=worker_type,
        )

    @property
    def num_gpus(self) -> int:
        return max(len(self.launch_spec.gpu_ids), 1)

    def owned_args(self, ports: list[int]) -> dict[str, Any]:
        """The ServerArgs the framework decides (docs/architecture.md#launching-an-sglang-server), by field name."""
        launch, cfg = self.launch_spec, self.config
        pp = int(cfg.server_args.get("pp_size", 1) or 1)
        nodes = launch.node_slice.num_nodes if launch.node_slice is not None else 1  # tp spans every node's GPUs
        args: dict[str, Any] = {
            "model_path": launch.model_path,
            "host": launch.host,
            "port": ports[0],
            "nccl_port": ports[1],
            "tp_size": max(self.num_gpus * nodes // pp, 1),
            "base_gpu_id": 0,  # CUDA_VISIBLE_DEVICES holds exactly this engine's GPUs
            "gpu_id_step": 1,
            "random_seed": launch.seed,
            "skip_server_warmup": True,
            "enable_metrics": True,
            "enable_memory_saver": launch.memory_saver,
            "enable_deterministic_inference": cfg.deterministic,
            "weight_version": launch.weight_version,
            "enable_return_routed_experts": launch.return_routed_experts,
        }
        if launch.device == "cpu":
            args["device"] = "cpu"
        if launch.lora is not None:  # server_args.py: --max-loras-per-batch 1, one adapter (the policy's)
            args |= {
                "enable_lora": True,
                "max_lora_rank": launch.lora.max_rank,
                "lora_target_modules": list(launch.lora.target_modules),
                "max_loras_per_batch": 1,
            }
        if launch.node_slice is not None:  # engine.py Engine._launch_subprocesses: rank 0 serves, the others follow
            span = launch.node_slice
            args |= {"nnodes": span.num_nodes, "node_rank": span.node_rank, "dist_init_addr": span.dist_init_addr}
        if cfg.worker_type != "regular":
            args["disaggregation_mode"] = cfg.worker_type
            args["disaggregation_bootstrap_port"] = ports[2]
        return args

    def launch_args(self) -> dict[str, Any]:
        """The server's other ServerArgs: the framework's defaults, then `rollout.sglang` and the overrides.

        trust_remote_code is on by default, as slime launches every server (`_compute_server_args`): checkpoints
        may ship their own modelling code. It stays the user's to turn off (`rollout.sglang.trust_remote_code:
        false`; a flag left out is False), since no config key decides it. A colocated server's prefill graphs
        default to disabled: SGLang's default prefill backend on CUDA (breakable) does not work with the memory
        saver (slime does the same). A None from the user keeps these defaults.
        """
        defaults: dict[str, Any] = {"trust_remote_code": True}
        if self.launch_spec.memory_saver:
            defaults["cuda_graph_backend_prefill"] = "disabled"
        user = self.config.server_args
        return {**defaults, **{k: v for k, v in user.items() if v is not None or k not in defaults}}

    def command(self, ports: list[int]) -> list[str]:
        owned = self.owned_args(ports)
        clash = sorted(set(owned) & set(self.config.server_args))
        if clash:  # validation rejects these first; a programmatic caller gets the same answer
            raise ValueError(f"ServerArgs {clash} are set by the framework; remove them from rollout.sglang")
        cli = server_args_cli({**owned, **self.launch_args()})
        return [sys.executable, "-m", self.config.launch_module, *cli]

    def env(self) -> dict[str, str]:
        return {**super().env(), "NCCL_CUMEM_ENABLE": "0"}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "worker_type": self.config.worker_type, "bootstrap_port": self.bootstrap_port}

    @property
    def bootstrap_port(self) -> int | None:
        """The PD bootstrap port the router needs for a prefill server (None otherwise)."""
        if self.config.worker_type != "prefill" or self.lease is None:
            return None
        return self.lease.ports[2]
