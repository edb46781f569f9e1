"""Engine servers a test starts: a real hf engine on a model directory, and an engine whose server is any command."""

from __future__ import annotations

from slime.engine import http_client
from slime.engine.base import EngineLaunch, EngineServer
from slime.engine.hf.config import HFEngineConfig
from slime.engine.hf.engine import HFEngine, HFServerConfig


def start_engine(
    model_dir, log_dir, *, device: str = "cpu", gpu_ids: tuple[str, ...] = (), deterministic: bool = False, **config
) -> HFEngine:
    """A started hf engine server (one process) on `model_dir`; `config` overrides HFEngineConfig fields;
    `deterministic`: rollout.deterministic (--enable-deterministic-inference)."""
    launch = EngineLaunch(
        rank=0,
        model_path=str(model_dir),
        host="127.0.0.1",
        seed=0,
        device=device,
        gpu_ids=gpu_ids,
        log_dir=str(log_dir),
        startup_timeout_s=180,
    )
    hf = HFEngineConfig(**{"max_batch_size": 4, "num_threads": 1, **config})
    engine = HFEngine(launch, HFServerConfig(hf, deterministic=deterministic))
    engine.start()
    return engine


class CommandEngine(EngineServer):
    """An engine whose server is an arbitrary command built from the reserved ports."""

    kind = "command"

    def __init__(self, make_cmd, log_dir, timeout_s=20.0, *, host="127.0.0.1", node_ip=None):
        super().__init__(
            EngineLaunch(
                rank=7,
                model_path="unused",
                host=host,
                node_ip=node_ip,
                seed=0,
                device="cpu",
                log_dir=str(log_dir),
                startup_timeout_s=timeout_s,
                shutdown_grace_s=2,
            ),
            None,
        )
        self.make_cmd = make_cmd

    def command(self, ports):
        return self.make_cmd(ports)


def generated_tokens(url: str) -> int:
    """Tokens an SGLang-API engine (the built-in one, the fake SGLang) has sampled since it started: its
    /server_info `internal_states[0].num_generated_tokens`."""
    return int(http_client.get(url + "/server_info")["internal_states"][0]["num_generated_tokens"])


def vllm_generated_tokens(url: str) -> float:
    """Tokens a vLLM server has sampled since it started (its `vllm:generation_tokens` counter, per decode step);
    0 while it does not answer (starting, or gone)."""
    try:
        _, text = http_client.request("GET", url + "/metrics", timeout=5)
    except http_client.EngineHTTPError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total"))
