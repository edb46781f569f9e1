"""The hf engine on one embedded rollout step: 32 prompts x 8 samples of 2 new tokens, every request in flight at
once (as the rollout sends them), each with its own `sampling_seed`. Rows: the engine decoding each request alone
(max batch 1, what `rollout.deterministic=true` makes it) and batching (the default 256), each direct and through
sglang-router as a run reaches it. Columns: wall seconds per step, the engine process's CPU seconds per step, and
the ratio of the wall time to the first row's, measured in the same invocation.

    python tools/bench_engine.py                                  # tiny_qwen3 (made under .cache if missing)
    python tools/bench_engine.py --rounds 20 --model-path /path/to/hf/model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, SAMPLES, NEW_TOKENS = 32, 8, 2


def tiny_qwen3(path: Path) -> Path:
    """conf/model/tiny_qwen3.yaml's random-weight model at `path` (made if missing)."""
    if not (path / "config.json").exists():
        from slime.assets.tiny_model import create_tiny_model
        from slime.config.schema import ModelConfig

        fields = yaml.safe_load((ROOT / "conf" / "model" / "tiny_qwen3.yaml").read_text())
        fields.pop("generate_at", None)
        create_tiny_model(ModelConfig(**{**fields, "hf_checkpoint": str(path)}))
    return path


def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer /health in {timeout_s} s")


def start_engine(model: Path, port: int, max_batch: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "slime.engine.hf.server", "--model-path", str(model), "--port", str(port)]
    cmd += ["--max-batch-size", str(max_batch), "--seed", "1", "--log-level", "WARNING"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


def start_router(port: int, engine_url: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port + 1)]
    cmd += ["--log-level", "warn", "--disable-health-check", "--disable-circuit-breaker"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    body = json.dumps({"url": engine_url, "worker_type": "regular"}).encode()
    request = urllib.request.Request(url + "/workers", data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()
    time.sleep(2.0)  # the router takes the worker once it has checked it
    return proc


def step_payloads(seed: int) -> list[dict]:
    """One rollout step's requests: each prompt's samples share it (the engine's prefix cache), seeds differ."""
    rng = random.Random(seed)
    out = []
    for _ in range(PROMPTS):
        prompt = [rng.randrange(4, 60) for _ in range(12)]
        for _ in range(SAMPLES):
            params = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "sampling_seed": rng.randrange(1 << 31)}
            out.append({"input_ids": prompt, "sampling_params": params, "return_logprob": True})
    return out


async def run_steps(url: str, rounds: int) -> float:
    """Mean wall seconds per step over `rounds` steps (after one warm-up step)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024)) as session:

        async def one(payload: dict) -> None:
            async with session.post(url + "/generate", json=payload) as resp:
                resp.raise_for_status()
                await resp.read()

        async def step(seed: int) -> None:
            await asyncio.gather(*(one(p) for p in step_payloads(seed)))

        await step(0)
        started = time.perf_counter()
        for i in range(rounds):
            await step(i + 1)
        return (time.perf_counter() - started) / rounds


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(model: Path, max_batch: int, via_router: bool, rounds: int, port: int, logs: Path) -> tuple[float, float]:
    """(wall s per step, engine CPU s per step)."""
    engine = start_engine(model, port, max_batch, logs / f"engine_{port}.log")
    router = None
    try:
        engine_url = f"http://127.0.0.1:{port}"
        wait_healthy(engine_url)
        url = engine_url
        if via_router:
            router = start_router(port + 10, engine_url, logs / f"router_{port}.log")
            url = f"http://127.0.0.1:{port + 10}"
        before = cpu_seconds(engine.pid)
        wall = asyncio.run(run_steps(url, rounds))
        return wall, (cpu_seconds(engine.pid) - before) / (rounds + 1)
    finally:
        for proc in (router, engine):
            if proc is not None:
                proc.terminate()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=ROOT / ".cache" / "models" / "tiny_qwen3")
    parser.add_argument("--rounds", type=int, default=8, help="rollout steps per row (after one warm-up step)")
    parser.add_argument("--port", type=int, default=29700, help="first port; each row takes a few above it")
    args = parser.parse_args()
    model = tiny_qwen3(args.model_path)
    rows = [("batch 1 (deterministic)", 1, False), ("batch 256", 256, False)]
    rows += [("batch 1, via router", 1, True), ("batch 256, via router", 256, True)]
    with tempfile.TemporaryDirectory() as logs:
        results = [
            (name, *measure(model, batch, router, args.rounds, args.port + 20 * i, Path(logs)))
            for i, (name, batch, router) in enumerate(rows)
        ]
    base = results[0][1]
    print(f"{PROMPTS} prompts x {SAMPLES} samples, {NEW_TOKENS} new tokens, {args.rounds} steps per row")
    print(f"{'engine':<26} {'wall s/step':>12} {'engine CPU s/step':>18} {'wall ratio':>11}")
    for name, wall, cpu in results:
        print(f"{name:<26} {wall:>12.3f} {cpu:>18.3f} {wall / base:>11.2f}")


if __name__ == "__main__":
    main()
