"""Training throughput on one GPU for an RL-shaped batch: real tokens/s, TFLOP/s, MFU and peak memory.

One optimizer step of GRPO (no KL: one forward + backward per sample) on a Qwen3-1.7B-shaped model with
random weights, over a ragged batch like RL produces: prompts 64-512 tokens, responses log-uniform
32-4096 tokens (14 samples, about 17k real tokens). Each variant runs in its own process, so its peak
memory is its own and an out-of-memory variant does not stop the others:

    python tools/bench_train.py                                   # every variant, Qwen3-1.7B shape
    python tools/bench_train.py --variants hf_padded_mb2 fsdp     # some of them
    python tools/bench_train.py --shape tiny --device cpu --steps 1   # a smoke run on CPU
    python tools/bench_train.py --variants megatron_16k_compile --profile /tmp/prof   # + a profiler table

MFU counts the model FLOPs of the real tokens only (REFERENCE.md §9.6, `slime.model_flops`): per token of a sequence
of length S, 3 × [L·(2·(H·Q + 2·H·KV + Q·H) + 6·H·F) + 2·H·V + L·2·Q·S] (every matmul, the LM head on every token,
causal attention halved), against a bf16 matmul ceiling (8192³) measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slime.model_flops import TRAIN_PASSES, forward_flops  # noqa: E402

MEGATRON_16K = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=16384"]
MEGATRON_32K = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=32768"]
FULL_RECOMPUTE = "parallelism.recompute.granularity=full"
# the MLP keeps only its input (its fc1 output and SwiGLU output, 3 x ffn per token, are recomputed)
SELECTIVE_MLP = ["parallelism.recompute.granularity=selective", "parallelism.recompute.modules=[mlp]"]
COMPILE = "parallelism.compile_layers=true"

# name -> (kind, config overrides of the fsdp/megatron backend or options of the padded baseline)
VARIANTS: dict[str, tuple[str, dict | list[str]]] = {
    "hf_padded_mb1": ("hf_padded", {"micro_batch_size": 1}),
    "hf_padded_mb2": ("hf_padded", {"micro_batch_size": 2}),
    "fsdp_autocast_mb2": (
        "fsdp",
        ["parallelism.micro_batch_size=2", "parallelism.fsdp.mixed_precision=autocast"],
    ),
    "fsdp_autocast_8k": (
        "fsdp",
        ["parallelism.max_tokens_per_gpu=8192", "parallelism.fsdp.mixed_precision=autocast"],
    ),
    "fsdp_8k": ("fsdp", ["parallelism.max_tokens_per_gpu=8192"]),
    "fsdp_16k": ("fsdp", ["parallelism.max_tokens_per_gpu=16384"]),
    "fsdp_16k_ckpt": ("fsdp", ["parallelism.max_tokens_per_gpu=16384", "parallelism.gradient_checkpointing=true"]),
    "fsdp_8k_compile": ("fsdp", ["parallelism.max_tokens_per_gpu=8192", "parallelism.fsdp.compile=true"]),
    "fsdp_16k_ckpt_compile": (
        "fsdp",
        [
            "parallelism.max_tokens_per_gpu=16384",
            "parallelism.gradient_checkpointing=true",
            "parallelism.fsdp.compile=true",
        ],
    ),
    "fsdp_32k_compile": ("fsdp", ["parallelism.max_tokens_per_gpu=32768", "parallelism.fsdp.compile=true"]),
    "fsdp_32k_ckpt_compile": (
        "fsdp",
        [
            "parallelism.max_tokens_per_gpu=32768",
            "parallelism.gradient_checkpointing=true",
            "parallelism.fsdp.compile=true",
        ],
    ),
    "megatron": ("megatron", MEGATRON_16K),
    "megatron_32k": ("megatron", MEGATRON_32K),
    "megatron_16k_recompute": ("megatron", [*MEGATRON_16K, FULL_RECOMPUTE]),
    "megatron_16k_compile": ("megatron", [*MEGATRON_16K, COMPILE]),
    "megatron_16k_selective": ("megatron", [*MEGATRON_16K, *SELECTIVE_MLP]),
    "megatron_16k_selective_compile": ("megatron", [*MEGATRON_16K, *SELECTIVE_MLP, COMPILE]),
    "megatron_32k_compile": ("megatron", [*MEGATRON_32K, COMPILE]),
    "megatron_32k_selective": ("megatron", [*MEGATRON_32K, *SELECTIVE_MLP]),
    "megatron_32k_selective_compile": ("megatron", [*MEGATRON_32K, *SELECTIVE_MLP, COMPILE]),
    "megatron_16k_full_recompute_compile": ("megatron", [*MEGATRON_16K, FULL_RECOMPUTE, COMPILE]),
    "megatron_32k_full_recompute_compile": ("megatron", [*MEGATRON_32K, FULL_RECOMPUTE, COMPILE]),
}
DEFAULT_VARIANTS = [name for name, (kind, _) in VARIANTS.items() if kind != "megatron"]
SHAPES = {"qwen3_1p7b": "qwen3_1_7b", "tiny": "tiny_qwen3"}


# ---- the batch and its FLOPs -------------------------------------------------------------------
def rl_batch_lengths(seed: int, count: int = 14) -> list[tuple[int, int]]:
    """(prompt, response) token counts: prompts uniform 64-512, responses log-uniform 32-4096."""
    rng = random.Random(seed)
    return [(rng.randint(64, 512), int(math.exp(rng.uniform(math.log(32), math.log(4096))))) for _ in range(count)]


def batch_flops(model, lengths: list[tuple[int, int]]) -> float:
    """Training FLOPs of the (prompt, response) batch, the LM head counted on every token (slime.model_flops)."""
    return TRAIN_PASSES * forward_flops(model, [(p + r, p + r) for p, r in lengths])


# ---- worker side ---------------------------------------------------------------------------------
def compose(shape: str, device: str, model_dir: str, overrides: list[str]):
    """The typed run config of the benchmark (the real config tree, no validation of paths or GPUs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from slime.config.loader import to_run_config
    from slime.config.store import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    cluster = "one_gpu" if device == "cuda" else "local_cpu"
    base = [
        f"model={SHAPES[shape]}",
        f"model.hf_checkpoint={model_dir}",
        f"cluster={cluster}",
        # the fsdp backend (a megatron variant's parallelism=megatron comes later and wins) and the built-in engine
        "parallelism=fsdp",
        "rollout=hf",
        "algo=grpo",
        "algo.use_kl_loss=false",
        "algo.kl_loss_coef=0",
        "train.num_rollout=100",
        "paths.output_dir=/tmp/bench_train",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_run_config(hydra_compose(config_name="config", overrides=base + overrides))


def write_model(cfg, model_dir: str, device: str) -> None:
    """A randomly initialised HF checkpoint of the configured shape (bf16 safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime.assets.tiny_model import hf_config_dict

    if (Path(model_dir) / "config.json").exists():
        return
    torch.manual_seed(0)
    config = AutoConfig.for_model(**hf_config_dict(cfg.model, eos_token_id=0, pad_token_id=0))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    model.save_pretrained(model_dir)


def make_batch(cfg, lengths: list[tuple[int, int]], seed: int):
    """The TrainBatch of one optimizer step on one rank: random token ids, random ±1 advantages."""
    from slime.rollout.postprocess import split_for_data_parallel
    from slime.types import Sample

    rng = random.Random(seed)
    samples = [
        Sample(
            index=i,
            tokens=[rng.randrange(cfg.model.vocab_size) for _ in range(p + r)],
            response_length=r,
            loss_mask=[1] * r,
            reward=float(rng.choice((0, 1))),
        )
        for i, (p, r) in enumerate(lengths)
    ]
    rewards = [s.reward - 0.5 for s in samples]
    n = len(samples)
    return split_for_data_parallel(
        samples, [s.reward for s in samples], rewards, global_batch_size=n, num_steps=1, dp_size=1
    )[0]


def time_steps(step, steps: int, device: str) -> list[float]:
    """Seconds of each of `steps` calls of `step()` after one warm-up call."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step()
    sync()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def backend_step(cfg, batch):
    """The configured train backend as the runtime drives it, one rank: load, advantages, one optimizer step."""
    from slime.net import free_port
    from slime.plan.derive import derive
    from slime.train.base import get_backend_class
    from slime.train.layout import RankLayout
    from slime.train.train_setup import TrainSetup

    setup = TrainSetup.from_run_config(cfg, derive(cfg))
    backend_cls = get_backend_class(cfg.parallelism.backend)
    backend = backend_cls(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    backend.init()

    def step():
        backend.load_batch(0, batch)
        backend.compute_advantages()
        backend.train()

    return step


def hf_padded_step(cfg, batch, *, micro_batch_size: int, device: str):
    """Plain transformers the way HF-based RL trainers feed it: fp32 parameters under bf16 autocast, SDPA,
    micro-batches of `micro_batch_size` samples right-padded to their longest, full-vocabulary logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        cfg.model.hf_checkpoint, dtype=torch.float32, attn_implementation="sdpa"
    )
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
    advantages = [r for r in batch.rewards]
    total_tokens = sum(batch.response_lengths)

    def step():
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(batch), micro_batch_size):
            idx = list(range(start, min(start + micro_batch_size, len(batch))))
            width = max(len(batch.tokens[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            attn = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width - 1)
            adv = torch.zeros(len(idx), width - 1)
            for row, i in enumerate(idx):
                tokens, resp = batch.tokens[i], batch.response_lengths[i]
                ids[row, : len(tokens)] = torch.tensor(tokens)
                attn[row, : len(tokens)] = 1
                mask[row, len(tokens) - resp - 1 : len(tokens) - 1] = 1
                adv[row] = advantages[i]
            ids, attn, mask, adv = (t.to(device) for t in (ids, attn, mask, adv))
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(adv * log_probs * mask).sum() / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def profile_step(step, out: Path) -> None:
    """One more step under torch.profiler: where the GPU time goes and how busy the GPU was."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"wall {wall:.3f} s, GPU kernels {busy:.3f} s ({100 * busy / wall:.0f}% busy)\n\n"
        + events.table(sort_by="self_device_time_total", row_limit=40)
        + "\n\n"
        + events.table(sort_by="cpu_time_total", row_limit=40)
        + "\n\nwhere the host waits for the GPU:\n"
        + "\n".join(
            f"{e.count:5d} x {e.key}: " + " <- ".join(e.stack[:6])
            for e in sorted(prof.key_averages(group_by_stack_n=6), key=lambda e: -e.count)
            if e.key in ("aten::item", "cudaStreamSynchronize", "aten::_local_scalar_dense")
        )
    )


def run_variant(args) -> dict:
    import torch

    kind, options = VARIANTS[args.worker]
    overrides = options if isinstance(options, list) else []
    cfg = compose(args.shape, args.device, args.model_dir, overrides)
    lengths = rl_batch_lengths(args.seed)
    batch = make_batch(cfg, lengths, args.seed)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if kind == "hf_padded":
        step = hf_padded_step(cfg, batch, device=args.device, **options)
    else:
        step = backend_step(cfg, batch)
    times = time_steps(step, args.steps, args.device)
    if args.profile:
        profile_step(step, Path(args.profile) / f"{args.worker}.txt")
    seconds = sorted(times)[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 2**30 if args.device == "cuda" else float("nan")
    tokens = sum(p + r for p, r in lengths)
    return {
        "variant": args.worker,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops": batch_flops(cfg.model, lengths) / seconds / 1e12,
        "peak_gib": peak,
        "reserved_gib": reserved,
        "tokens": tokens,
    }


def matmul_ceiling(device: str) -> float:
    """bf16 TFLOP/s of an 8192³ matmul (the MFU denominator)."""
    import torch

    if device != "cuda":
        return float("nan")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, iters = time.perf_counter(), 30
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * iters / (time.perf_counter() - start) / 1e12


# ---- driver side ---------------------------------------------------------------------------------
def run_in_subprocess(name: str, args, model_dir: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            name,
            "--shape",
            args.shape,
            "--device",
            args.device,
            "--model-dir",
            model_dir,
            "--steps",
            str(args.steps),
            "--seed",
            str(args.seed),
            "--result",
            out.name,
        ] + (["--profile", args.profile] if args.profile else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"variant": name, "error": f"timed out after {args.timeout} s"}
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            error = "out of memory" if "OutOfMemoryError" in proc.stderr else " | ".join(tail)[-300:]
            return {"variant": name, "error": error}
        return json.loads(Path(out.name).read_text())


def print_table(rows: list[dict], ceiling: float, baseline: str | None) -> None:
    base = next((r for r in rows if r["variant"] == baseline and "error" not in r), None)
    print(f"\nbf16 matmul ceiling: {ceiling:.0f} TFLOP/s")
    print("| variant | real tokens/s | TFLOP/s | MFU | peak GiB (reserved) | vs baseline |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} | | | | |")
            continue
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""
        print(
            f"| {r['variant']} | {r['tokens_per_s'] / 1e3:.1f}k | {r['tflops']:.0f} | "
            f"{100 * r['tflops'] / ceiling:.1f}% | {r['peak_gib']:.1f} ({r['reserved_gib']:.1f}) | {ratio} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=sorted(VARIANTS))
    parser.add_argument("--shape", default="qwen3_1p7b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps after one warm-up (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per variant")
    parser.add_argument("--baseline", default="hf_padded_mb2")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--profile", help="write a torch.profiler table of one extra step per variant to this dir")
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        Path(args.result).write_text(json.dumps(run_variant(args)))
        return
    with tempfile.TemporaryDirectory() as model_dir:
        cfg = compose(args.shape, args.device, model_dir, [])
        write_model(cfg, model_dir, args.device)
        lengths = rl_batch_lengths(args.seed)
        print(
            f"model {SHAPES[args.shape]}: {len(lengths)} samples, {sum(p + r for p, r in lengths)} real tokens, "
            f"longest {max(p + r for p, r in lengths)}; {args.steps} timed steps (median)"
        )
        ceiling = matmul_ceiling(args.device)
        rows = []
        for name in args.variants:
            rows.append(run_in_subprocess(name, args, model_dir))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows, ceiling, args.baseline)
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling_tflops": ceiling, "rows": rows}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
