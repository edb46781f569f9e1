"""Training throughput on one GPU for an RL-shaped batch: real tokens/s, TFLOP/s, MFU and peak memory.

One optimizer step of GRPO (no KL: one forward + backward per sample) on a Qwen3-1.7B-shaped model with
random weights, over a ragged batch like RL produces: prompts 64-512 tokens, responses log-uniform
32-4096 tokens (14 samples, about 17k real tokens). Each variant runs in its own process, so its peak
memory is its own and an out-of-memory variant does not stop the others:

    python tools/bench_train.py                                   # every variant, Qwen3-1.7B shape
    python tools/bench_train.py --variants hf_padded_mb2 fsdp     # some of them
    python tools/bench_train.py --shape tiny --device cpu --steps 1   # a smoke run on CPU
    python tools/bench_train.py --variants megatron_16k_compile --profile /tmp/prof   # + a profiler table
    python tools/bench_train.py --variants fsdp_16k --batch-from RUN/rollout_data/2.jsonl   # a run's batch
    python tools/bench_train.py --variants fsdp_16k_ckpt_lora --memory-history /tmp/mem   # what the peak holds

MFU counts the model FLOPs of the real tokens only (docs/architecture.md#model-flops, `slime.models.flops`): per
token of a sequence
of length S, 3 × [L·(2·(H·Q + 2·H·KV + Q·H) + 6·H·F) + 2·H·V + L·2·Q·S] (every matmul, the LM head on every token,
causal attention halved), against a bf16 matmul ceiling (8192³) measured in the same run. A LoRA variant's frozen
weights count 2 passes instead of 3 (no weight gradient; `slime.models.flops.train_flops`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from slime.plan.derive import derive  # noqa: E402
from slime.plan.memory import GIB, estimate_memory  # noqa: E402
from slime.rollout.dumps import load_rollout_data  # noqa: E402
from slime.train.throughput import matmul_ceiling_tflops  # noqa: E402
from tools.bench_train_steps import (  # noqa: E402
    SHAPES,
    backend_step,
    batch_flops,
    compose,
    hf_padded_step,
    make_batch,
    profile_step,
    rl_batch_lengths,
    time_steps,
    write_model,
)
from tools.memory_at_peak import recording  # noqa: E402

# the model's preset brings full recompute with parallelism=megatron; a variant says whether it recomputes
MEGATRON_16K = [
    "parallelism=megatron",
    "parallelism.recompute.granularity=null",
    "parallelism.max_tokens_per_gpu=16384",
]
MEGATRON_32K = [
    "parallelism=megatron",
    "parallelism.recompute.granularity=null",
    "parallelism.max_tokens_per_gpu=32768",
]
FULL_RECOMPUTE = "parallelism.recompute.granularity=full"
# the MLP keeps only its input (its fc1 output and SwiGLU output, 3 x ffn per token, are recomputed)
SELECTIVE_MLP = ["parallelism.recompute.granularity=selective", "parallelism.recompute.modules=[mlp]"]
COMPILE = "parallelism.compile_layers=true"
LORA = "model.lora.rank=32"

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
    "fsdp_16k_eager": ("fsdp", ["parallelism.max_tokens_per_gpu=16384", "parallelism.fsdp.compile=false"]),
    "fsdp_16k_ckpt": ("fsdp", ["parallelism.max_tokens_per_gpu=16384", "parallelism.gradient_checkpointing=true"]),
    # LoRA rank 32 on every projection: the frozen base in bf16, adapters and their AdamW state fp32
    "fsdp_16k_lora": ("fsdp", ["parallelism.max_tokens_per_gpu=16384", LORA]),
    "fsdp_16k_ckpt_lora": (
        "fsdp",
        ["parallelism.max_tokens_per_gpu=16384", "parallelism.gradient_checkpointing=true", LORA],
    ),
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
    # torchao's float8 training of the decoder layers' linears (parallelism.fp8; the fp8 extra, or after .gpu/setup.sh
    # PYTHONPATH=/tmp/torchao), against the same variant in bf16
    "fsdp_32k_ckpt_compile_fp8": (
        "fsdp",
        [
            "parallelism.max_tokens_per_gpu=32768",
            "parallelism.gradient_checkpointing=true",
            "parallelism.fsdp.compile=true",
            "parallelism.fp8=true",
        ],
    ),
    "fsdp_32k_compile_fp8": (
        "fsdp",
        ["parallelism.max_tokens_per_gpu=32768", "parallelism.fsdp.compile=true", "parallelism.fp8=true"],
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


# ---- worker side: one variant in its own process ---------------------------------------------
def run_variant(args) -> dict:
    if args.memory_history and args.device == "cuda":
        with recording(Path(args.memory_history) / f"{args.worker}.txt"):
            return _run_variant(args)
    return _run_variant(args)


def _run_variant(args) -> dict:
    kind, options = VARIANTS[args.worker]
    overrides = options if isinstance(options, list) else []
    cfg = compose(args.shape, args.device, args.model_dir, overrides)
    lengths = batch_lengths(args)
    batch = make_batch(cfg, lengths, args.seed)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if kind == "hf_padded":
        step = hf_padded_step(cfg, batch, device=args.device, **options)
    else:
        step = backend_step(cfg, batch)
    times, logged = time_steps(step, args.steps, args.device)
    if args.profile:
        profile_step(step, Path(args.profile) / f"{args.worker}.txt")
    seconds = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 2**30 if args.device == "cuda" else float("nan")
    tokens = sum(p + r for p, r in lengths)
    row = {
        "variant": args.worker,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops": batch_flops(cfg.model, lengths) / seconds / 1e12,
        "peak_gib": peak,
        "reserved_gib": reserved,
        "tokens": tokens,
    }
    if kind != "hf_padded":  # what a run of this config logs and plans (`perf/*`, the dry run's estimate)
        row["run_tflops"] = statistics.median(perf["perf/train_tflops"] for perf in logged)
        row["run_mfu"] = statistics.median(perf.get("perf/mfu", float("nan")) for perf in logged)
        # the dry run's estimate with the activations of the fullest micro-batch the step trained, as a run's end
        # summary sets it (the dry run sizes full micro-batches, which this batch may not fill)
        fullest = int(max(perf["perf/micro_batch_tokens"] for perf in logged))
        several = max(perf["perf/micro_batches_per_step"] for perf in logged) > 1
        plan = estimate_memory(cfg, derive(cfg), micro_batch=fullest, several=several)
        row["plan_gib"] = plan.train_peak / GIB
    return row


def batch_lengths(args) -> list[tuple[int, int]]:
    """(prompt, response) token counts: the RL-shaped synthetic batch, or the samples of a run's rollout dump
    (`--batch-from`, written with debug.save_rollout_data=true) in its order."""
    if not args.batch_from:
        return rl_batch_lengths(args.seed)
    dump = Path(args.batch_from)
    samples = [s for group in load_rollout_data(dump.parent, int(dump.stem)) for s in group]
    return [(len(s.tokens) - s.response_length, s.response_length) for s in samples]


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
        ]
        if args.profile:
            cmd += ["--profile", args.profile]
        if args.memory_history:
            cmd += ["--memory-history", args.memory_history]
        if args.batch_from:
            cmd += ["--batch-from", args.batch_from]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as exc:
            _keep_log(args.logs, name, exc.stdout, exc.stderr)
            return {"variant": name, "error": f"timed out after {args.timeout} s"}
        _keep_log(args.logs, name, proc.stdout, proc.stderr)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            error = "out of memory" if "OutOfMemoryError" in proc.stderr else " | ".join(tail)[-300:]
            return {"variant": name, "error": error}
        return json.loads(Path(out.name).read_text())


def _keep_log(logs: str | None, name: str, stdout, stderr) -> None:
    """The worker's output in `logs`/<variant>.log (with TORCH_LOGS=recompiles,graph_breaks: what compiled)."""
    if logs:
        text = "".join(x.decode() if isinstance(x, bytes) else x or "" for x in (stdout, stderr))
        Path(logs).mkdir(parents=True, exist_ok=True)
        (Path(logs) / f"{name}.log").write_text(text)


def print_table(rows: list[dict], ceiling: float, baseline: str | None) -> None:
    """The bench's figures, and beside a backend's: what a run of its config logs (`perf/train_tflops`, `perf/mfu`:
    the LM head on response tokens only, the train phase alone, its own ceiling) and the dry run's estimate of a
    training GPU's peak memory against the measured one."""
    base = next((r for r in rows if r["variant"] == baseline and "error" not in r), None)
    print(f"\nbf16 matmul ceiling: {ceiling:.0f} TFLOP/s")
    print(
        "| variant | real tokens/s | TFLOP/s | MFU | peak GiB (reserved) | vs baseline "
        "| run's perf/train_tflops, perf/mfu | plan GiB (vs peak) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} | | | | | | |")
            continue
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""
        run = plan = ""
        if "run_tflops" in r:
            run = f"{r['run_tflops']:.0f}, {100 * r['run_mfu']:.1f}% ({r['run_mfu'] * ceiling / r['tflops']:.3f}x)"
            plan = f"{r['plan_gib']:.1f} ({r['plan_gib'] / r['peak_gib']:.2f}x)"
        print(
            f"| {r['variant']} | {r['tokens_per_s'] / 1e3:.1f}k | {r['tflops']:.0f} | "
            f"{100 * r['tflops'] / ceiling:.1f}% | {r['peak_gib']:.1f} ({r['reserved_gib']:.1f}) | {ratio} | {run} "
            f"| {plan} |"
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
    parser.add_argument("--logs", help="write each variant's worker output to <dir>/<variant>.log")
    parser.add_argument(
        "--memory-history",
        help="record each worker's CUDA allocations and write what was live at its peak, by place, to "
        "<dir>/<variant>.txt (tools/memory_at_peak.py)",
    )
    parser.add_argument(
        "--batch-from",
        help="train on this rollout dump's samples (<run dir>/rollout_data/<step>.jsonl of a run with "
        "debug.save_rollout_data=true; its model's shape is --shape)",
    )
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
        lengths = batch_lengths(args)
        print(
            f"model {SHAPES[args.shape]}: {len(lengths)} samples, {sum(p + r for p, r in lengths)} real tokens, "
            f"longest {max(p + r for p, r in lengths)}; {args.steps} timed steps (median)"
        )
        ceiling = matmul_ceiling_tflops(torch.device(args.device)) or float("nan")  # the runs' perf/mfu ceiling
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
