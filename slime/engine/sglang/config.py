"""The SGLang engine's options sections, `rollout.sglang` and `rollout.sglang_launch`: what its spec
(slime/engine/sglang/spec.py) adds to the run's schema (slime/run_schema.py). Torch-free and sglang-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class SGLangLaunchConfig:
    """How each SGLang server starts (`rollout.engine=sglang`); its ServerArgs are `rollout.sglang`."""

    module: str = "sglang.launch_server"  # run as `python -m <module>` with SGLang's CLI (CPU tests: a fake server)
    startup_timeout_s: float = 600.0  # launch until GET /health_generate answers 200


@dataclass(kw_only=True)
class SGLangOptions:
    """The keys the SGLang engine adds to `rollout`."""

    # SGLang ServerArgs fields the framework does not set itself (slime.engine.sglang.server_args)
    sglang: dict[str, Any] = field(default_factory=dict)
    sglang_launch: SGLangLaunchConfig = field(default_factory=SGLangLaunchConfig)
