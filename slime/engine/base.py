"""`EngineServer`: the contract every rollout engine kind (hf, sglang, vllm) implements.

An engine is one inference server process (SGLang's HTTP API, or vLLM's through `VLLMClient`). The framework, not the
server, owns its placement and its ports:

1. `EngineLaunch` says where and as what the engine runs (rank, model, host, seed, device, the
   physical GPU ids of its `cluster.rollout.num_gpus_per_engine` bundles, log dir); the kind's own
   typed config (`rollout.hf`, `rollout.sglang`, ...) says how. Nothing else reaches the engine.
2. `start()` reserves `num_ports` ports on this node (`slime.engine.ports`), builds the command line
   with `command(ports)` from the launch and the kind's config only, starts it in its own process
   group (dies with its parent), and polls GET `health_path` on the server's URL until 200;
   a crash or a timeout raises `EngineStartupError` with the tail of the server log.
3. Control calls go through `client` (the kind's `client_class`, an `EngineClient` speaking the framework's
   vocabulary over the kind's HTTP API), so the weight-sync classes and the rollout manager drive any
   engine kind alike; servers register with the kind's `router_class`. `shutdown()` stops the process tree.

A kind subclasses `EngineServer`, implements `command(ports)` (and `env()` if it needs more than the
GPU and thread variables), and is registered by name in `slime.registry.ENGINES`. Plain class, no
Ray import: the rollout manager wraps it in an actor, the GPU tier drives it directly.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar, Optional

from slime.engine.client import EngineClient
from slime.engine.ports import PortLease, reserve_ports
from slime.engine.process import child_env, http_url, launch_process, log_tail, terminate_process
from slime.engine.router import Router
from slime.net import reached_at
from slime.registry import ENGINES

logger = logging.getLogger(__name__)


class EngineStartupError(RuntimeError):
    """The server exited or did not become healthy in time; the message carries its log tail."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAServing:
    """The LoRA adapters a server takes at run time (SGLang's --enable-lora, --max-lora-rank, --lora-target-modules):
    the policy's adapters, synced alone (`model.lora`)."""

    max_rank: int
    target_modules: tuple[str, ...]
    adapter_name: str = "policy"  # the name the syncs load it under and every generation request gives


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeSlice:
    """This server's part of an engine spanning nodes: one server per node (--nnodes / --node-rank), all meeting at
    the first node's rendezvous address (host:port: SGLang's --dist-init-addr, vLLM's --master-addr / --master-port);
    node rank 0 serves the API."""

    num_nodes: int
    node_rank: int
    dist_init_addr: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineLaunch:
    """Where and as what one engine runs; the same fields for every engine kind."""

    rank: int  # engine index: names the log `<log_dir>/engine_<rank>.log`
    model_path: str  # HF checkpoint dir (architecture, tokenizer; weights are pushed before rollout 0)
    host: str  # address the server binds to (cluster.host)
    seed: int  # the server's sampling seed
    device: str  # cpu | cuda
    log_dir: str
    gpu_ids: tuple[str, ...] = ()  # physical GPU ids of the engine's bundles (cuda); empty on cpu
    weight_version: str = "0"  # reported until the first weight update
    # the trainer's precision as a torch dtype name (float32 | bfloat16; auto: the engine's own choice), what an
    # engine that takes a dtype serves in unless its own config sets one
    dtype: str = "auto"
    memory_saver: bool = False  # colocated with the trainer: the server must release/resume memory by tag
    # the trainer replays the engine's MoE routing (algo.routing_replay=rollout): capture and return each token's
    # experts (SGLang's --enable-return-routed-experts)
    return_routed_experts: bool = False
    lora: Optional[LoRAServing] = None  # serve the policy's LoRA adapters (None: full weights only)
    node_slice: Optional[NodeSlice] = None  # one node's server of an engine spanning nodes (None: the whole engine)
    node_ip: Optional[str] = None  # the IP of the server's node: where it is reached when `host` is a wildcard
    startup_timeout_s: float = 600.0  # launch until health answers 200
    shutdown_grace_s: float = 10.0  # SIGTERM to SIGKILL


class EngineServer(abc.ABC):
    """One server process of an engine kind; see the module docstring for the contract."""

    num_ports: ClassVar[int] = 1  # ports reserved per server; ports[0] serves HTTP
    health_path: ClassVar[str] = "/health_generate"
    kind: ClassVar[str] = "base"  # the registry name (rollout.engine)
    unset_env: ClassVar[tuple[str, ...]] = ()  # variables of the parent's environment the server must not see
    client_class: ClassVar[type[EngineClient]] = EngineClient  # the kind's HTTP control calls
    router_class: ClassVar[type[Router]] = Router  # the router the kind's servers register with

    def __init__(self, launch: EngineLaunch, config: Any):
        self.launch_spec = launch
        self.config = config
        span = launch.node_slice
        node = f"_node{span.node_rank}" if span is not None and span.node_rank > 0 else ""
        self.log_path = Path(launch.log_dir) / f"engine_{launch.rank}{node}.log"
        self.process: Optional[subprocess.Popen] = None
        self.lease: Optional[PortLease] = None
        self._launched_at = 0.0

    # ---------------------------------------------------------------- to implement
    @classmethod
    def config_from(cls, rollout: Any, *, worker_type: str = "regular", overrides: Optional[dict] = None) -> Any:
        """The kind's own config out of `rollout` (a RolloutConfig) for one server group: `rollout.<kind>`.
        Kinds without server-group options (validation rejects them) ignore `worker_type` and `overrides`."""
        return getattr(rollout, cls.kind)

    @abc.abstractmethod
    def command(self, ports: list[int]) -> list[str]:
        """The server's command line; it must serve HTTP on `launch_spec.host:ports[0]`."""

    def env(self) -> dict[str, str]:
        """Extra environment of the server process: its GPUs (cuda)."""
        if self.launch_spec.device == "cuda" and self.launch_spec.gpu_ids:
            return {"CUDA_VISIBLE_DEVICES": ",".join(self.launch_spec.gpu_ids)}
        return {}

    # ---------------------------------------------------------------- lifecycle
    @property
    def rank(self) -> int:
        return self.launch_spec.rank

    @property
    def url(self) -> str:
        if self.lease is None:
            raise RuntimeError(f"engine {self.rank} has no port yet: call start()")
        return http_url(reached_at(self.launch_spec.host, self.launch_spec.node_ip), self.lease.ports[0])

    @property
    def client(self) -> EngineClient:
        return self.client_class(self.url)

    def start(self) -> str:
        """Launch and wait until healthy; returns the URL. Raises EngineStartupError on failure."""
        self.launch()
        return self.wait_until_ready()

    def launch(self) -> None:
        """Reserve ports and start the process without waiting (then `wait_until_ready()`), so that
        callers can start several engines in parallel."""
        if self.is_running():
            raise RuntimeError(f"engine {self.rank} is already running (pid {self.process.pid})")
        self.lease = reserve_ports(self.launch_spec.host, self.num_ports)
        self._launched_at = time.monotonic()
        env = child_env(self.env())
        for name in self.unset_env:
            env.pop(name, None)
        self.process = launch_process(self.command(list(self.lease.ports)), log_path=self.log_path, env=env)
        logger.info(
            "engine %d (%s) launched, pid %d, ports %s, log %s",
            self.rank,
            self.kind,
            self.process.pid,
            self.lease.ports,
            self.log_path,
        )

    def wait_until_ready(self) -> str:
        """Poll GET `health_path` (every 0.2-0.5 s: a ready engine waits little) until 200, the process dies,
        or the timeout passes."""
        deadline = self._launched_at + self.launch_spec.startup_timeout_s
        interval = 0.2
        try:
            while True:
                self._check_alive()
                if self.client.is_healthy(self.health_path, timeout=max(1.0, min(30.0, deadline - time.monotonic()))):
                    break
                if time.monotonic() > deadline:
                    raise EngineStartupError(
                        f"engine {self.rank} took longer than {self.launch_spec.startup_timeout_s:.0f} s to answer "
                        f"GET {self.health_path} with 200 at {self.url}; last log lines of {self.log_path}:\n"
                        f"{log_tail(self.log_path)}"
                    )
                time.sleep(interval)
                interval = min(0.5, interval * 1.5)
        except BaseException:
            self.shutdown()
            raise
        logger.info("engine %d ready at %s after %.1f s", self.rank, self.url, time.monotonic() - self._launched_at)
        return self.url

    def _check_alive(self) -> None:
        if not self.is_running():
            code = None if self.process is None else self.process.returncode
            raise EngineStartupError(
                f"engine {self.rank} exited with status {code} before becoming healthy; last log lines of "
                f"{self.log_path}:\n{log_tail(self.log_path)}"
            )

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return None if self.process is None else self.process.pid

    def describe(self) -> dict[str, Any]:
        """`{rank, kind, url, pid, log}` of the running server (what engines.json lists)."""
        return {
            "rank": self.rank,
            "kind": self.kind,
            "url": self.url if self.lease else None,
            "pid": self.pid,
            "log": str(self.log_path),
        }

    def shutdown(self) -> None:
        """SIGTERM the server's process group, SIGKILL after the grace period, free the ports. Idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            terminate_process(proc, grace_s=self.launch_spec.shutdown_grace_s)
            logger.info("engine %d stopped (status %s)", self.rank, proc.returncode)
        if self.lease is not None:
            self.lease.release()

    def __repr__(self) -> str:
        where = self.url if self.lease else "not started"
        return f"{type(self).__name__}(rank={self.rank}, {where})"


def engine_client(kind: str, url: str) -> EngineClient:
    """The control client of a server of engine kind `kind` (`rollout.engine`) at `url`."""
    return get_engine_class(kind).client_class(url)


def get_engine_class(name: str) -> type[EngineServer]:
    """The engine class registered as `rollout.engine=<name>`; ValueError naming the choices otherwise."""
    return ENGINES.load(name)
