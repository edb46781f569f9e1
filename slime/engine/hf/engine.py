"""`HFEngine`: launches the built-in transformers server (`slime.engine.hf.server`) as a child process.

Device selection is the caller's business: on CUDA set CUDA_VISIBLE_DEVICES in the environment
before `start()`; this class only passes `--device`.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

from slime.engine.base import HTTPEngine, register_engine
from slime.engine.process import child_env, launch_process

if TYPE_CHECKING:  # the GPU tier runs without omegaconf; any object with these attributes works
    from slime.config.schema import HFEngineConfig


@register_engine("hf")
class HFEngine(HTTPEngine):
    """One `slime.engine.hf.server` process.

    Args:
        model_path: HF checkpoint directory (config, tokenizer, safetensors).
        rank: engine index (log file `<log_dir>/engine_<rank>.log`).
        host: bind address (loopback by default in the cluster config).
        seed: the server's sampling seed (the caller adds the rank offset it wants).
        device: "cpu" or "cuda" / "cuda:N".
        cfg: max batch size, batch wait (ms), dtype, torch threads, startup timeout (s).
        log_dir: directory of the server log.
        weight_version: version reported until the first weight update; kept up to date by
            `update_weights_from_disk`, so a restarted server reports the latest one.
    """

    def __init__(
        self,
        *,
        model_path: str,
        rank: int,
        host: str,
        seed: int,
        device: str,
        cfg: HFEngineConfig,
        log_dir: str,
        weight_version: str = "0",
    ):
        super().__init__(rank=rank, host=host, log_dir=log_dir, startup_timeout_s=cfg.startup_timeout_s)
        self.model_path = str(model_path)
        self.seed = int(seed)
        self.device = device
        self.cfg = cfg
        self.weight_version = str(weight_version)

    def command(self, port_file: str) -> list[str]:
        """The server command line (port 0: the server binds an ephemeral port and reports it)."""
        cfg = self.cfg
        return [
            sys.executable, "-m", "slime.engine.hf.server",
            "--model-path", self.model_path,
            "--host", self.host,
            "--port", "0",
            "--port-file", port_file,
            "--seed", str(self.seed),
            "--device", self.device,
            "--dtype", cfg.dtype,
            "--batch-wait-ms", str(cfg.batch_wait_ms),
            "--num-threads", str(cfg.num_threads),
            "--weight-version", self.weight_version,
        ] + (["--max-batch-size", str(cfg.max_batch_size)] if cfg.max_batch_size else [])

    def _launch(self, port_file: str) -> subprocess.Popen:
        threads = str(max(1, self.cfg.num_threads))
        env = child_env({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"})
        return launch_process(self.command(port_file), log_path=self.log_path, env=env)

    def update_weights_from_disk(self, path, weight_version=None, load_format=None, timeout: float = 600.0) -> dict:
        body = super().update_weights_from_disk(path, weight_version, load_format, timeout)
        if weight_version is not None:
            self.weight_version = str(weight_version)
        return body
