"""The hf engine on one embedded rollout step: 32 prompts x 8 samples of 2 new tokens, every request in flight at
once (as the rollout sends them), each with its own `sampling_seed`. Rows: the engine decoding each request alone
(max batch 1), batching with batch-invariant forward passes (`rollout.deterministic=true`: the same tokens whatever
shares a batch, slime/engine/hf/batch_invariant.py) and batching without them (`rollout.deterministic=false`), each
direct and through sglang-router as a run reaches it. The three engines of a route run at once and take their
steps in turn, so that they share the machine's load. Columns: wall seconds per step, the engine process's CPU
seconds per step, and the ratio of the wall time to the non-deterministic batching's on the same route, measured in
the same invocation.

A second table: a long-tail step (1 request in 32 with 10x the new tokens, every request ignore_eos) with at most
64 requests in flight (a rollout that sends the next request as one returns, as a streaming rollout or a low
`rollout.concurrency` does), on the engine's scheduler in this process, static batches (each runs until its last
row ends) against continuous batching (requests join the running batch), their steps interleaved.

    python tools/bench_engine.py                                  # tiny_qwen3 (made under .cache if missing)
    python tools/bench_engine.py --rounds 20 --model-path /path/to/hf/model

With `--decode` it measures decode throughput instead: the engine's generator (no HTTP, no router) decoding
`--requests` prompts of 12 tokens at once, `--new-tokens` each (ignore_eos), on `--device`; generated tokens per
second, median of `--rounds` after a warm-up, for each decode path: the dynamic cache (`rollout.hf.cuda_graphs=false`),
the static cache run eagerly, and (on cuda) the static cache with CUDA graphs, the engine's default there. `--shape qwen3_1p7b` writes a random-weights Qwen3-1.7B-shaped model
first (tools/bench_sync_model.py), the GPU figure of docs/performance.md:

    python tools/bench_engine.py --decode --device cuda --shape qwen3_1p7b --requests 14 --new-tokens 512 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout without the package installed (the GPU machine's copy)
from slime.config.schema_rollout import RouterConfig  # noqa: E402
from slime.engine.base import EngineLaunch  # noqa: E402
from slime.engine.hf.config import HFEngineConfig  # noqa: E402
from slime.engine.hf.engine import HFEngine, HFServerConfig  # noqa: E402
from slime.engine.router import Router  # noqa: E402
from tools.make_tiny_model import make_tiny_model  # noqa: E402

PROMPTS, SAMPLES, NEW_TOKENS = 32, 8, 2
LONG_EVERY, LONG_FACTOR, IN_FLIGHT = 32, 10, 64  # the long-tail step


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


VARIANTS = [  # (row name, max batch size, rollout.deterministic)
    ("one at a time (batch 1)", 1, True),
    ("deterministic, batch 256", 256, True),
    ("non-deterministic, 256", 256, False),
]


async def interleaved_steps(urls: dict[str, str], pids: dict[str, int], rounds: int) -> dict[str, tuple[float, float]]:
    """(wall s, engine CPU s) per step for each engine at its URL, their steps taken in turn (after one warm-up step
    each)."""
    processes = {name: psutil.Process(pid) for name, pid in pids.items()}
    sums = {name: [0.0, 0.0] for name in urls}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024)) as session:

        async def one(url: str, payload: dict) -> None:
            async with session.post(url + "/generate", json=payload) as resp:
                resp.raise_for_status()
                await resp.read()

        async def step(url: str, seed: int) -> None:
            await asyncio.gather(*(one(url, p) for p in step_payloads(seed)))

        for url in urls.values():
            await step(url, 0)
        for i in range(rounds):
            for name, url in urls.items():
                cpu, wall = sum(processes[name].cpu_times()[:2]), time.perf_counter()
                await step(url, i + 1)
                sums[name][0] += time.perf_counter() - wall
                sums[name][1] += sum(processes[name].cpu_times()[:2]) - cpu
    return {name: (wall / rounds, cpu / rounds) for name, (wall, cpu) in sums.items()}


def measure(model: Path, via_router: bool, rounds: int, logs: Path) -> dict[str, tuple[float, float]]:
    """(wall s per step, engine CPU s per step) of each of VARIANTS: the engines as a run starts them (`HFEngine`,
    with rollout.deterministic as `HFEngine.config_from` passes it), and sglang-router as a run launches it
    (`Router.launch`) where `via_router`."""
    engines, routers, urls = {}, [], {}
    try:
        for rank, (name, max_batch, deterministic) in enumerate(VARIANTS):
            launch = EngineLaunch(
                rank=rank, model_path=str(model), host="127.0.0.1", seed=1, device="cpu", log_dir=str(logs)
            )
            config = HFServerConfig(HFEngineConfig(max_batch_size=max_batch), deterministic=deterministic)
            engines[name] = HFEngine(launch, config)
            urls[name] = engines[name].start()
            if via_router:
                routers.append(Router.launch(cfg=RouterConfig(), log_path=logs / f"router_{rank}.log"))
                routers[-1].add_worker(urls[name])
                urls[name] = routers[-1].url
        return asyncio.run(interleaved_steps(urls, {n: e.pid for n, e in engines.items()}, rounds))
    finally:
        for router in routers:
            router.shutdown()
        for engine in engines.values():
            engine.shutdown()


def long_tail_requests(seed: int) -> list:
    """The long-tail step's requests: `step_payloads`' with every LONG_EVERY-th one LONG_FACTOR times as long."""
    from slime.engine.hf.generator import GenerationRequest
    from slime.engine.hf.sampling import SamplingParams

    reqs = []
    for i, payload in enumerate(step_payloads(seed)):
        params = dict(payload["sampling_params"], ignore_eos=True)
        params["max_new_tokens"] *= LONG_FACTOR if i % LONG_EVERY == 0 else 1
        reqs.append(GenerationRequest(payload["input_ids"], SamplingParams.from_dict(params)))
    return reqs


async def long_tail_steps(schedulers: dict, rounds: int) -> dict[str, tuple[float, float]]:
    """(wall s, this process's CPU s) per long-tail step for each scheduler, their steps interleaved (after one
    warm-up step each)."""
    process, sums = psutil.Process(), {name: [0.0, 0.0] for name in schedulers}

    async def step(scheduler, seed: int) -> None:
        in_flight = asyncio.Semaphore(IN_FLIGHT)

        async def one(req) -> None:
            async with in_flight:
                await scheduler.submit([req])

        await asyncio.gather(*(one(r) for r in long_tail_requests(seed)))

    for scheduler in schedulers.values():
        scheduler.start()
        await step(scheduler, 0)
    for i in range(rounds):
        for name, scheduler in schedulers.items():
            wall, cpu = time.perf_counter(), sum(process.cpu_times()[:2])
            await step(scheduler, i + 1)
            sums[name][0] += time.perf_counter() - wall
            sums[name][1] += sum(process.cpu_times()[:2]) - cpu
    for scheduler in schedulers.values():
        await scheduler.stop()
    return {name: (wall / rounds, cpu / rounds) for name, (wall, cpu) in sums.items()}


def measure_long_tail(model: Path, rounds: int) -> dict[str, tuple[float, float]]:
    """The long-tail step on the engine's scheduler in this process (the engine's model loading, its default batch
    size, batch wait and torch threads), static against continuous batching."""
    import torch
    from transformers.utils import logging as hf_logging

    from slime.engine.hf.generator import Generator
    from slime.engine.hf.scheduler import Scheduler
    from slime.engine.hf.server import load_model

    cfg = HFEngineConfig()
    torch.set_num_threads(cfg.num_threads)
    hf_logging.disable_progress_bar()
    weights, tokenizer = load_model(str(model), "cpu", cfg.dtype)
    schedulers = {
        name: Scheduler(
            Generator(weights, tokenizer, seed=1, prefix_cache_tokens=cfg.prefix_cache_tokens),
            max_batch_size=256,
            batch_wait_s=cfg.batch_wait_ms / 1000,
            weight_version="0",
            continuous=continuous,
        )
        for name, continuous in (("static batches", False), ("continuous batching", True))
    }
    return asyncio.run(long_tail_steps(schedulers, rounds))


DECODE_PATHS = [  # (row name, Generator's static_decode, cuda_graphs)
    ("dynamic cache (cuda_graphs=false)", False, False),
    ("static cache, eager", True, False),
    ("static cache + CUDA graphs", True, True),
]


def measure_decode(model: Path, device: str, requests: int, new_tokens: int, rounds: int) -> dict[str, float]:
    """Generated tokens per second of the engine's generator decoding `requests` random 12-token prompts at once,
    `new_tokens` each (ignore_eos), on `device` in the engine's dtype there (median of `rounds`, after a warm-up round
    in which the graphs are captured), for each of DECODE_PATHS (the graphs' row on cuda only)."""
    import torch

    from slime.engine.hf.generator import GenerationRequest, Generator
    from slime.engine.hf.sampling import SamplingParams
    from slime.engine.hf.server import load_model

    weights, tokenizer = load_model(str(model), device, HFEngineConfig().dtype)
    rng = random.Random(0)
    params = {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True}

    def one_round(generator) -> float:
        batch = [
            GenerationRequest([rng.randrange(4, 60) for _ in range(12)], SamplingParams.from_dict(params))
            for _ in range(requests)
        ]
        start = time.perf_counter()
        results = generator.generate(batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        assert all(len(r.output_ids) == new_tokens for r in results)
        return time.perf_counter() - start

    rates = {}
    for name, static, graphs in DECODE_PATHS:
        if graphs and not device.startswith("cuda"):
            continue
        generator = Generator(
            weights, tokenizer, seed=1, prefix_cache_tokens=0, static_decode=static, cuda_graphs=graphs
        )
        one_round(generator)
        rates[name] = requests * new_tokens / statistics.median(one_round(generator) for _ in range(rounds))
        generator.flush_cache()
    return rates


def bench_model(args: argparse.Namespace, work: Path) -> Path:
    """The model directory to serve: `--shape qwen3_1p7b` written into `work`, else `--model-path` (the tiny model
    made there when missing)."""
    if args.shape == "qwen3_1p7b":
        import torch

        from tools.bench_sync_model import model_config, random_weights, write_model_dir

        config = model_config(False, work / "model")
        write_model_dir(config, random_weights(config, torch.device("cpu"), seed=0), work / "model")
        return work / "model"
    if not (args.model_path / "config.json").exists():
        return make_tiny_model("tiny_qwen3", args.model_path)
    return args.model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=ROOT / ".cache" / "models" / "tiny_qwen3")
    parser.add_argument("--rounds", type=int, default=8, help="rollout steps per row (after one warm-up step)")
    parser.add_argument("--decode", action="store_true", help="decode throughput on --device instead")
    parser.add_argument("--device", default="cpu", help="--decode: cpu | cuda")
    parser.add_argument("--shape", choices=("qwen3_1p7b",), help="--decode: a random-weights model of this shape")
    parser.add_argument("--requests", type=int, default=14, help="--decode: requests decoded at once")
    parser.add_argument("--new-tokens", type=int, default=512, help="--decode: tokens generated per request")
    args = parser.parse_args()
    if args.decode:
        with tempfile.TemporaryDirectory() as work:
            model = bench_model(args, Path(work))
            rates = measure_decode(model, args.device, args.requests, args.new_tokens, args.rounds)
        base = rates[DECODE_PATHS[0][0]]
        print(f"{args.shape or model.name} on {args.device}, {args.requests} requests x {args.new_tokens} new tokens")
        print(f"| decode path | generated tokens/s (median of {args.rounds}) | ratio |\n|---|---|---|")
        for name, rate in rates.items():
            print(f"| {name} | {rate:.0f} | {rate / base:.2f} |")
        return
    model = bench_model(args, Path("."))
    with tempfile.TemporaryDirectory() as logs:
        routes = {
            route: measure(model, route == "via router", args.rounds, Path(logs)) for route in ("direct", "via router")
        }
    print(f"{PROMPTS} prompts x {SAMPLES} samples, {NEW_TOKENS} new tokens, {args.rounds} steps per row")
    print(f"{'engine':<36} {'wall s/step':>12} {'engine CPU s/step':>18} {'wall ratio':>11}")
    for route, results in routes.items():
        base = results[VARIANTS[-1][0]][0]
        for name, (wall, cpu) in results.items():
            print(f"{name + ', ' + route:<36} {wall:>12.3f} {cpu:>18.3f} {wall / base:>11.2f}")
    long_tail = measure_long_tail(model, args.rounds)
    print(
        f"\nlong tail: 1 request in {LONG_EVERY} with {NEW_TOKENS * LONG_FACTOR} new tokens, {IN_FLIGHT} in flight, "
        f"batch 256, in-process scheduler, {args.rounds} steps per row"
    )
    print(f"{'engine':<26} {'wall s/step':>12} {'process CPU s/step':>18} {'wall ratio':>11}")
    base = long_tail["static batches"][0]
    for name, (wall, cpu) in long_tail.items():
        print(f"{name:<26} {wall:>12.3f} {cpu:>18.3f} {wall / base:>11.2f}")


if __name__ == "__main__":
    main()
