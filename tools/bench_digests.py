"""Weight-digest benchmark: each way of digesting a model's tensors where they live (slime.wire.weight_digest), timed
alone on the device against the copy floor measured in the same run, on the shape tools/bench_sync.py pushes.

    python tools/bench_digests.py             # Qwen3-1.7B shape, bf16, random weights, cuda:0
    python tools/bench_digests.py --tiny      # a small shape on CPU

Rows: the block sums of the whole model in one launch (what an engine's report runs), one launch per bucket (what a
push's ledger runs), one launch per tensor, torch's reduction per tensor, the fold of the block sums to the host, and
the digests end to end.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.config.schema_rollout import WeightSyncConfig  # noqa: E402
from slime.wire import weight_digest  # noqa: E402
from tools.bench_sync_model import bucketed, median_seconds, model_config, random_weights, sync_floor  # noqa: E402


def digest_paths(named, bucket_bytes: int) -> dict[str, Callable[[], object]]:
    """{row: one digest of every tensor by that path}."""
    tensors = [t for _, t in named]
    buckets = [[t for _, t in b] for b in bucketed(named, bucket_bytes)]
    sums = weight_digest.block_sums_of(tensors)
    return {
        "block sums, one launch for the model (an engine's report)": lambda: weight_digest.block_sums_of(tensors),
        "block sums, one launch per bucket (a push)": lambda: [weight_digest.block_sums_of(b) for b in buckets],
        "block sums, one launch per tensor": lambda: [weight_digest.block_sums_of([t]) for t in tensors],
        "block sums, torch's reduction per tensor": lambda: [weight_digest.block_sums(t) for t in tensors],
        "fold of the model's block sums (to the host)": lambda: weight_digest.fold(sums),
        "digests of the model, end to end": lambda: weight_digest.digests(tensors),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a small shape on CPU")
    p.add_argument("--bucket-mb", type=int, default=WeightSyncConfig().bucket_mb, help="a push's bucket size, MiB")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per row, after one warm-up")
    args = p.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda:0")
    named = random_weights(model_config(args.tiny, Path("unused")), device, seed=1)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    floor = sync_floor(named, device, args.repeats)
    print(
        f"model: {len(named)} tensors, {nbytes / 1e9:.3f} GB bf16 on {device}; device copy floor {floor * 1e3:.2f} ms"
    )
    print("\n| digest path | ms (median) | GB/s | x the device-copy floor |")
    print("|---|---|---|---|")
    for label, run in digest_paths(named, args.bucket_mb << 20).items():
        med = median_seconds(run, device, args.repeats)
        print(f"| {label} | {med * 1e3:.2f} | {nbytes / med / 1e9:.0f} | {med / floor:.2f} |")


if __name__ == "__main__":
    main()
