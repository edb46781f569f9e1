"""Weight-sync benchmark: a trainer process pushes a model into an hf engine process through the real sync
code (`slime.sync.*` via `slime.registry.WEIGHT_SYNC`), for each mode, and prints a table.

    python tools/bench_sync.py                  # Qwen3-1.7B shape, bf16, random weights, default buckets, cuda:0
    python tools/bench_sync.py --tiny           # a small shape on CPU (seconds)
    python tools/bench_sync.py --modes tensor --bucket-mb 512,1024,2048 --repeats 5

This process is the trainer: it holds HF-named random bf16 tensors on its device, cut into buckets of
`--bucket-mb` MiB, and pushes them with `WeightSync.push` (pause, flush, transfer, continue), exactly as
the train backend's source rank does. The engine is the built-in hf server (`slime.engine.hf`), started
from an HF directory of the same shape written first. Per mode the table gives the median wall time of a
full sync, its GB/s, and the in-process floor measured in the same run: one device copy of the same bytes.
`distributed` needs the engine on a second device under NCCL (two NCCL ranks cannot share one GPU); with
one GPU it is skipped with a message. On CPU it runs over gloo.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.assets.tiny_model import hf_config_dict  # noqa: E402
from slime.assets.tokenizer import build_tokenizer  # noqa: E402
from slime.config.schema import HFEngineConfig, ModelConfig  # noqa: E402
from slime.config.schema_rollout import WeightSyncConfig  # noqa: E402
from slime.engine.base import EngineLaunch  # noqa: E402
from slime.engine.hf.engine import HFEngine  # noqa: E402
from slime.registry import WEIGHT_SYNC  # noqa: E402
from slime.sync.base import SyncContext  # noqa: E402
from slime.wire.hf_dir import write_hf_dir  # noqa: E402
from slime.wire.tensors import Bucket, bucket_nbytes  # noqa: E402

QWEN3_1P7B = dict(
    num_layers=28, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16, num_query_groups=8, kv_channels=128
)
TINY = dict(
    num_layers=4, hidden_size=256, ffn_hidden_size=768, num_attention_heads=4, num_query_groups=2, kv_channels=64
)
MODES = ("tensor", "distributed", "disk")


def model_config(tiny: bool, out_dir: Path) -> ModelConfig:
    shape = TINY if tiny else QWEN3_1P7B
    return ModelConfig(
        name="bench", hf_checkpoint=str(out_dir), vocab_size=4096 if tiny else 151936, tie_word_embeddings=True, **shape
    )


def random_weights(model: ModelConfig, device: torch.device, seed: int) -> list[tuple[str, torch.Tensor]]:
    """HF-named bf16 tensors of the model's shape (names and shapes from transformers on the meta device)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    fields = hf_config_dict(model, eos_token_id=0, pad_token_id=0)
    fields.pop("architectures")
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(Qwen3Config(**fields), dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed)
    return [
        (name, (torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16))
        for name, p in net.named_parameters()
    ]


def into_buckets(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    buckets: list[Bucket] = [[]]
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tensor))
        size += nbytes
    return buckets


def write_model_dir(model: ModelConfig, named, out_dir: Path) -> None:
    """An HF directory the engine starts from: config, tokenizer and (these) weights."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = hf_config_dict(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_hf_dir(into_buckets(named, 1 << 30), out_dir, source_checkpoint=out_dir)


def sync_floor(named, device: torch.device, repeats: int) -> float:
    """Seconds for one in-process copy of every tensor's bytes into one device buffer (median)."""
    total = sum(t.numel() * t.element_size() for _, t in named)
    dst = torch.empty(total, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):
        _synchronize(device)
        start = time.perf_counter()
        offset = 0
        for _, t in named:
            n = t.numel() * t.element_size()
            dst[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
            offset += n
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first copy warms the allocator


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_engine(model_dir: Path, log_dir: Path, device: str, gpu: str | None) -> HFEngine:
    launch = EngineLaunch(
        rank=0 if gpu in (None, "0") else int(gpu),
        model_path=str(model_dir),
        host="127.0.0.1",
        seed=0,
        device=device,
        log_dir=str(log_dir),
        gpu_ids=(gpu,) if gpu is not None else (),
        startup_timeout_s=900,
    )
    engine = HFEngine(launch, HFEngineConfig(dtype="bfloat16", max_batch_size=4, num_threads=2))
    engine.start()
    return engine


def bench_mode(
    mode: str, engine: HFEngine, buckets: list[Bucket], work_dir: Path, args, *, pipelined: bool = True
) -> list[dict]:
    """`perf/*` of each timed push (after one warm-up): the whole push, and the mode's own phases; `pipelined`
    false runs tensor mode one bucket at a time (its baseline)."""
    context = SyncContext(
        source_checkpoint=str(engine.launch_spec.model_path),
        work_dir=str(work_dir),
        bucket_bytes=max(bucket_nbytes(b) for b in buckets),
    )
    sync = WEIGHT_SYNC.load(mode)([engine.client], context)
    sync.pipelined = pipelined
    pushes = []
    try:
        for version in range(1, args.repeats + 2):  # the first push warms up (group join, allocator, page cache)
            start = time.perf_counter()
            perf = sync.push(iter(buckets), weight_version=version)
            pushes.append({**perf, "wall": time.perf_counter() - start})
            if args.check:
                check_bit_exact(engine, buckets)
    finally:
        sync.close()
    return pushes[1:]


def variants(modes: list[str], bucket_mbs: list[int]) -> list[tuple[str, int, bool]]:
    """(mode, bucket MiB, pipelined) to measure: tensor mode also one bucket at a time, its baseline."""
    out = []
    for mode in modes:
        for mb in bucket_mbs:
            out += [(mode, mb, True), (mode, mb, False)] if mode == "tensor" else [(mode, mb, True)]
    return out


def median_ms(pushes: list[dict], key: str) -> float:
    return statistics.median(p.get(key, 0.0) for p in pushes) * 1e3


def check_bit_exact(engine: HFEngine, buckets: list[Bucket]) -> None:
    """Every pushed tensor's checksum in the engine (`/weights_checker`) equals the bucket's; raises otherwise."""
    from slime.engine.hf.weight_checker import tensor_checksum

    got = engine.client.check_weights("checksum")["ranks"][0]["checksums"]
    differ = [n for b in buckets for n, t in b if got.get(n) != tensor_checksum(t.to(torch.bfloat16))]
    if differ:
        raise RuntimeError(f"{len(differ)} tensors differ in the engine after the sync: {differ[:8]}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a small shape on CPU")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available, cpu with --tiny)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--bucket-mb",
        default=str(WeightSyncConfig().bucket_mb),
        help="bucket sizes in MiB, comma-separated (each one measured; default: rollout.weight_sync.bucket_mb's)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed syncs per mode, after one warm-up sync")
    p.add_argument(
        "--check", action="store_true", help="compare every tensor's checksum with the engine's after each sync (slow)"
    )
    p.add_argument("--work-dir", default=None, help="model dir, disk-sync dirs and logs (default: a temp dir)")
    return p.parse_args()


def measure(named, device: torch.device, work: Path, args) -> list[tuple[str, int, int, list[dict]]]:
    """(row label, bucket MiB, buckets, timed pushes) of every variant; one engine process per device it needs."""
    engine_device = "cuda" if device.type == "cuda" else "cpu"
    engines: dict[str, HFEngine] = {}
    rows = []
    try:
        for mode, mb, pipelined in variants(args.modes.split(","), [int(x) for x in args.bucket_mb.split(",")]):
            gpu = None if engine_device == "cpu" else "0"
            if mode == "distributed" and engine_device == "cuda":
                if torch.cuda.device_count() < 2:
                    print("distributed: skipped, NCCL needs the engine on a second GPU (one visible)")
                    continue
                gpu = "1"
            key = gpu or "cpu"
            if key not in engines:
                engines[key] = start_engine(work / "model", work / "logs", engine_device, gpu)
            buckets = into_buckets(named, mb << 20)
            pushes = bench_mode(mode, engines[key], buckets, work / "sync", args, pipelined=pipelined)
            rows.append((mode if pipelined else f"{mode} (one bucket at a time)", mb, len(buckets), pushes))
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rows


def print_table(rows, nbytes: int, floor: float) -> None:
    print(
        "\n| mode | bucket MiB | buckets | ms per full sync (median) | GB/s | min-max ms | pack ms | engines load ms "
        "| floor: device copy ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, mb, count, pushes in rows:
        walls = [p["wall"] for p in pushes]
        med = statistics.median(walls)
        print(
            f"| {mode} | {mb} | {count} | {med * 1e3:.1f} | {nbytes / med / 1e9:.2f} | "
            f"{min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f} | {median_ms(pushes, 'perf/update_weights_pack_time'):.1f} "
            f"| {median_ms(pushes, 'perf/update_weights_load_time'):.1f} | {floor * 1e3:.2f} |"
        )


def main() -> None:
    args = parse_args()
    device = torch.device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda:0"))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="slime-bench-sync-"))
    model = model_config(args.tiny, work / "model")
    named = random_weights(model, device, seed=1)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    print(f"model: {len(named)} tensors, {nbytes / 1e9:.3f} GB bf16 on {device}")
    write_model_dir(model, [(n, t.cpu()) for n, t in random_weights(model, device, seed=0)], work / "model")
    floor = sync_floor(named, device, args.repeats)
    print_table(measure(named, device, work, args), nbytes, floor)
    print(f"\n{nbytes / 1e9:.3f} GB per sync; {args.repeats} timed syncs per row after one warm-up; work dir {work}")
    print("pack: flattening buckets into staging buffers; load: the engines' update calls (hand-over and copy);")
    print("the rest of a sync is pause, flush, the update session and continue. Pipelined tensor mode packs the")
    print("next bucket while the engines load one, so its pack and load overlap.")
    if device.type == "cpu":
        print("(CPU: tensor mode hands buckets over as shared-memory segments; GPU: CUDA IPC handles)")


if __name__ == "__main__":
    main()
