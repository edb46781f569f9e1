"""The vLLM engine's options sections, `rollout.vllm` and `rollout.vllm_launch`: what its spec
(slime/engine/vllm/spec.py) adds to the run's schema (slime/run_schema.py). Torch-free and vllm-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class VLLMLaunchConfig:
    """How each vLLM server starts (`rollout.engine=vllm`); its server arguments are `rollout.vllm`."""

    # run as `python -m <module>` with vLLM's server CLI (`vllm serve`'s; CPU tests: a fake server)
    module: str = "vllm.entrypoints.launchers.api_server.entry"
    # node ranks >= 1 of an engine spanning nodes run `python -m <headless_module> serve ... --headless` (vLLM's CLI,
    # cli/serve.py run_headless: workers only; the API server entry above would ignore --headless)
    headless_module: str = "vllm.entrypoints.cli.main"
    startup_timeout_s: float = 600.0  # launch until GET /health answers 200


@dataclass(kw_only=True)
class VLLMOptions:
    """The keys the vLLM engine adds to `rollout`."""

    # vLLM server arguments the framework does not set itself (slime.engine.vllm.engine_args), e.g.
    # gpu_memory_utilization: 0.7; prefill_num_servers: N (PD) is the framework's
    vllm: dict[str, Any] = field(default_factory=dict)
    vllm_launch: VLLMLaunchConfig = field(default_factory=VLLMLaunchConfig)
