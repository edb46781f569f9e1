"""`HFEngine`: the built-in transformers server (`slime.engine.hf.server`) as an `EngineServer`.

Its command line comes from the launch (`EngineLaunch`), `rollout.hf` (`HFEngineConfig`) and rollout.deterministic only.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from slime.engine.base import EngineLaunch, EngineServer
from slime.engine.hf.client import BuiltinEngineClient

if TYPE_CHECKING:  # the GPU tier runs without omegaconf; any object with these attributes works
    from slime.engine.hf.config import HFEngineConfig


class HFServerConfig:
    """What one hf server starts with besides its `EngineLaunch`: `rollout.hf` (its fields read through) and
    rollout.deterministic (`--enable-deterministic-inference`, SGLang's flag). An `HFEngineConfig` on its own
    starts a server without it."""

    def __init__(self, hf: HFEngineConfig, *, deterministic: bool):
        self.hf = hf
        self.deterministic = deterministic

    def __getattr__(self, name: str):
        if name == "hf":  # not set yet (unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.hf, name)


class HFEngine(EngineServer):
    """One `slime.engine.hf.server` process (one device; `rollout.hf` sizes its batches and threads)."""

    kind = "hf"
    client_class = BuiltinEngineClient

    def __init__(self, launch: EngineLaunch, config: HFEngineConfig | HFServerConfig):
        super().__init__(launch, config)

    @classmethod
    def config_from(cls, rollout, *, worker_type: str = "regular", overrides: dict | None = None) -> HFServerConfig:
        """`rollout.hf` and rollout.deterministic (the built-in engine has no server-group options)."""
        return HFServerConfig(rollout.hf, deterministic=rollout.deterministic)

    def command(self, ports: list[int]) -> list[str]:
        launch, cfg = self.launch_spec, self.config
        return [
            sys.executable,
            "-m",
            "slime.engine.hf.server",
            "--model-path",
            launch.model_path,
            "--host",
            launch.host,
            "--port",
            str(ports[0]),
            "--seed",
            str(launch.seed),
            "--device",
            launch.device,
            "--dtype",
            cfg.dtype,
            "--batch-wait-ms",
            str(cfg.batch_wait_ms),
            "--num-threads",
            str(cfg.num_threads),
            "--prefix-cache-tokens",
            str(cfg.prefix_cache_tokens),
            "--weight-version",
            launch.weight_version,
        ] + (
            (["--max-batch-size", str(cfg.max_batch_size)] if cfg.max_batch_size else [])
            + (["--enable-deterministic-inference"] if getattr(cfg, "deterministic", False) else [])
            + ([] if getattr(cfg, "cuda_graphs", True) else ["--disable-cuda-graph"])
            + (["--enable-return-routed-experts"] if launch.return_routed_experts else [])
            + (self._lora_flags() if launch.lora else [])
        )

    def _lora_flags(self) -> list[str]:
        lora = self.launch_spec.lora
        return ["--enable-lora", "--max-lora-rank", str(lora.max_rank), "--lora-target-modules", *lora.target_modules]

    def env(self) -> dict[str, str]:
        threads = str(max(1, self.config.num_threads))
        return {
            **super().env(),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TOKENIZERS_PARALLELISM": "false",
        }
