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
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from slime.config.schema_rollout import HFEngineConfig, RouterConfig
from slime.engine.base import EngineLaunch
from slime.engine.hf.engine import HFEngine
from slime.engine.router import Router

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.make_tiny_model import make_tiny_model  # noqa: E402

PROMPTS, SAMPLES, NEW_TOKENS = 32, 8, 2


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


def measure(model: Path, max_batch: int, via_router: bool, rounds: int, logs: Path) -> tuple[float, float]:
    """(wall s per step, engine CPU s per step): the engine as a run starts it (`HFEngine`), and sglang-router as
    a run launches it (`Router.launch`) where `via_router`."""
    launch = EngineLaunch(rank=0, model_path=str(model), host="127.0.0.1", seed=1, device="cpu", log_dir=str(logs))
    engine = HFEngine(launch, HFEngineConfig(max_batch_size=max_batch))
    router = None
    try:
        url = engine.start()
        if via_router:
            router = Router.launch(cfg=RouterConfig(), log_path=logs / "router.log")
            router.add_worker(url)
            url = router.url
        process = psutil.Process(engine.pid)
        before = sum(process.cpu_times()[:2])
        wall = asyncio.run(run_steps(url, rounds))
        return wall, (sum(process.cpu_times()[:2]) - before) / (rounds + 1)
    finally:
        if router is not None:
            router.shutdown()
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=ROOT / ".cache" / "models" / "tiny_qwen3")
    parser.add_argument("--rounds", type=int, default=8, help="rollout steps per row (after one warm-up step)")
    args = parser.parse_args()
    model = args.model_path
    if not (model / "config.json").exists():
        model = make_tiny_model("tiny_qwen3", model)
    rows = [("batch 1 (deterministic)", 1, False), ("batch 256", 256, False)]
    rows += [("batch 1, via router", 1, True), ("batch 256, via router", 256, True)]
    with tempfile.TemporaryDirectory() as logs:
        results = [(name, *measure(model, batch, router, args.rounds, Path(logs))) for name, batch, router in rows]
    base = results[0][1]
    print(f"{PROMPTS} prompts x {SAMPLES} samples, {NEW_TOKENS} new tokens, {args.rounds} steps per row")
    print(f"{'engine':<26} {'wall s/step':>12} {'engine CPU s/step':>18} {'wall ratio':>11}")
    for name, wall, cpu in results:
        print(f"{name:<26} {wall:>12.3f} {cpu:>18.3f} {wall / base:>11.2f}")


if __name__ == "__main__":
    main()
