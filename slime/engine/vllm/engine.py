"""`VLLMEngine`: one vLLM OpenAI-compatible server as an `EngineServer`.

Command line: `python -m vllm.entrypoints.launchers.api_server.entry` (what `vllm serve` runs) with the
framework's arguments (`engine_args.owned_args`: model, host, the reserved port, tensor parallel size from
the engine's GPUs, seed, sleep mode when colocated, log-probs mode) plus the ones only the engine adapter
decides: `--weight-transfer-config {"backend": "nccl" | "ipc"}` from `rollout.weight_sync.mode`, the NIXL
`--kv-transfer-config` of a PD server, `--enable-server-load-tracking` (GET /load counts in-flight
generate requests, polled after an abort) and `--enable-scale-out` (the token-level `/inference/v1/generate`
the rollout calls answers 403 without it); then the launch's defaults, which `rollout.vllm` and the server
group's overrides may change: `--dtype` of the trainer's precision (vLLM's `auto` would serve an fp32
checkpoint in bf16) and, on CPU, a 1 GiB KV cache (`slime.engine.vllm.cpu`). On CPU a tied checkpoint is
served through its untied view (`slime.engine.vllm.cpu.untied_view`, under the log directory), under the
checkpoint's own name.

Environment: the engine's GPUs as CUDA_VISIBLE_DEVICES; VLLM_SERVER_DEV_MODE=1 (mounts /sleep, /wake_up,
/reset_prefix_cache, /collective_rpc and the RL weight-transfer routes); VLLM_ALLOW_INSECURE_SERIALIZATION=1
(the IPC handles travel pickled over HTTP, from this run's trainer only); a PD server's NIXL side channel
on its second reserved port; no PYTORCH_CUDA_ALLOC_CONF (expandable segments break vLLM's sleep allocator).

Control calls go through `VLLMClient`, routers are `VLLMRouter`s. Nothing here imports vllm; `launch_module`
swaps the entry point for a server that parses the same CLI (the CPU tests' `tests/fakes/fake_vllm.py`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from slime.engine.base import EngineLaunch, EngineServer
from slime.engine.vllm import cpu, engine_args
from slime.engine.vllm.client import VLLMClient
from slime.engine.vllm.router import VLLMRouter
from slime.net import reached_at

if TYPE_CHECKING:
    from slime.config.schema import RolloutConfig

# rollout.weight_sync.mode -> vLLM weight transfer backend (disk reloads through /collective_rpc instead)
TRANSFER_BACKENDS = {"tensor": "ipc", "distributed": "nccl"}
PD_CONNECTOR = "NixlConnector"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32.0 config/lora.py: MaxLoRARanks


@dataclasses.dataclass(frozen=True, kw_only=True)
class VLLMEngineConfig:
    """What one vLLM server is started with besides its `EngineLaunch`."""

    args: dict[str, Any]  # rollout.vllm + the group's overrides, already validated (framework keys included)
    launch_module: str = engine_args.LAUNCH_MODULE
    headless_module: str = "vllm.entrypoints.cli.main"  # node ranks >= 1 of an engine spanning nodes (`serve`)
    startup_timeout_s: float = 600.0
    worker_type: str = "regular"  # regular | prefill | decode (PD disaggregation)
    weight_transfer_backend: Optional[str] = "nccl"  # vLLM's weight transfer backend, None: disk syncs only


class VLLMEngine(EngineServer):
    """One vLLM server over `len(launch.gpu_ids)` GPUs; see the module docstring."""

    kind = "vllm"
    num_ports: ClassVar[int] = 2  # HTTP, the NIXL side channel of a PD server
    health_path = "/health"
    unset_env = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # expandable segments break the sleep allocator
    client_class = VLLMClient
    router_class = VLLMRouter

    def __init__(self, launch: EngineLaunch, config: VLLMEngineConfig):
        super().__init__(launch, config)

    @classmethod
    def config_from(
        cls, rollout: RolloutConfig, *, worker_type: str = "regular", overrides: dict | None = None
    ) -> VLLMEngineConfig:
        """`rollout.vllm` with the server group's `overrides` on top, the group's worker type, the sync backend."""
        return VLLMEngineConfig(
            args={**rollout.vllm, **(overrides or {})},
            launch_module=rollout.vllm_launch.module,
            headless_module=rollout.vllm_launch.headless_module,
            startup_timeout_s=rollout.vllm_launch.startup_timeout_s,
            worker_type=worker_type,
            weight_transfer_backend=TRANSFER_BACKENDS.get(rollout.weight_sync.mode),
        )

    def adapter_args(self) -> dict[str, Any]:
        """The owned arguments the engine adapter decides (not the launch: the sync backend, PD, load tracking,
        the generate route, the name a served view answers to)."""
        cfg = self.config
        args: dict[str, Any] = {"enable_server_load_tracking": True, "enable_scale_out": True}
        if self.launch_spec.return_routed_experts:
            args["enable_return_routed_experts"] = True
        if self.served_path() != self.launch_spec.model_path:
            args["served_model_name"] = self.launch_spec.model_path
        if cfg.weight_transfer_backend:
            args["weight_transfer_config"] = {"backend": cfg.weight_transfer_backend}
        if cfg.worker_type != "regular":
            args["kv_transfer_config"] = {"kv_connector": PD_CONNECTOR, "kv_role": "kv_both"}
        if self.launch_spec.lora is not None:  # vLLM 0.32 config/lora.py: max_lora_rank is one of MaxLoRARanks
            rank = min(r for r in LORA_RANKS if r >= self.launch_spec.lora.max_rank)
            args |= {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}
        return args

    def launch_defaults(self) -> dict[str, Any]:
        """Arguments the launch sets unless `rollout.vllm` (or the group's overrides) sets them."""
        launch, given = self.launch_spec, self.config.args
        defaults: dict[str, Any] = {}
        if launch.dtype != "auto":
            defaults["dtype"] = launch.dtype
        if launch.device == "cpu" and "kv_cache_memory_bytes" not in given and "gpu_memory_utilization" not in given:
            defaults["kv_cache_memory_bytes"] = cpu.DEFAULT_KV_CACHE_BYTES
        return defaults

    def served_path(self) -> str:
        """The directory the server loads: the checkpoint, or on CPU the untied view of a tied one."""
        launch = self.launch_spec
        tied = (Path(launch.model_path) / "config.json").exists() and cpu.is_tied(launch.model_path)
        if launch.device == "cpu" and tied:
            return str(Path(launch.log_dir) / f"engine_{launch.rank}_untied_model")
        return launch.model_path

    def launch(self) -> None:
        if self.served_path() != self.launch_spec.model_path:
            cpu.untied_view(self.launch_spec.model_path, self.served_path())
        super().launch()

    @property
    def one_cpu_worker(self) -> bool:
        """A CPU server of one worker: one slot, no parallel size above 1, not a slice of an engine spanning nodes."""
        launch, args = self.launch_spec, self.config.args
        parallel = [int(args.get(name) or 1) for name in engine_args.PARALLEL_SIZES]
        return launch.device == "cpu" and launch.node_slice is None and len(launch.gpu_ids) <= 1 and max(parallel) == 1

    @property
    def headless(self) -> bool:
        """A node rank >= 1 of an engine spanning nodes: vLLM's workers there, no API server."""
        return self.launch_spec.node_slice is not None and self.launch_spec.node_slice.node_rank > 0

    def command(self, ports: list[int]) -> list[str]:
        launch, cfg = self.launch_spec, self.config
        span = launch.node_slice  # tp spans every node's GPUs
        argv = engine_args.server_args(
            {**self.launch_defaults(), **cfg.args},
            model_path=self.served_path(),
            host=launch.host,
            port=ports[0],
            num_gpus=len(launch.gpu_ids) if span is None else max(len(launch.gpu_ids), 1) * span.num_nodes,
            seed=launch.seed,
            sleep_mode=launch.memory_saver,
        )
        argv += engine_args.cli_flags(self.adapter_args())
        if span is not None:
            argv += engine_args.cli_flags(engine_args.node_span_args(span))
        if self.headless:
            return [sys.executable, "-m", cfg.headless_module, "serve", *argv]
        return [sys.executable, "-m", cfg.launch_module, *argv]

    def wait_until_ready(self) -> str:
        """A headless node answers no HTTP (cli/serve.py run_headless): it is up once its process runs; node rank 0
        becomes healthy only after every node's workers joined its rendezvous."""
        if not self.headless:
            return super().wait_until_ready()
        self._check_alive()
        return self.url

    def env(self) -> dict[str, str]:
        env = {**super().env(), "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        if self.launch_spec.return_routed_experts:  # vLLM 0.32 config/aux_output.py: routes need model runner V2
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        if self.launch_spec.lora is not None:  # envs.py: mounts /v1/load_lora_adapter and /v1/unload_lora_adapter
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.one_cpu_worker:
            # vLLM's CPU platform runs the one worker inside the engine-core process only with this off
            # (platforms/cpu.py: check_and_update_config); a worker process of its own spins on its shared-memory
            # queue for 1 s after every message (shm_broadcast.py: SpinCondition.busy_loop_s), a core all rollout
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.config.worker_type != "regular" and self.lease is not None:
            # the address the decode side connects to (vLLM's nixl connector sends it): never a wildcard
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = reached_at(self.launch_spec.host, self.launch_spec.node_ip)
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.lease.ports[1])
        return env

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "worker_type": self.config.worker_type, "bootstrap_port": None}
        return described | ({"url": None} if self.headless else {})  # a headless node serves no HTTP
