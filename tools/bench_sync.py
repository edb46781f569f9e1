"""Weight-sync benchmark: a trainer process pushes a model into an hf engine process through the real sync
code (`slime.sync.*` via `slime.registry.WEIGHT_SYNC`), for each mode, and prints a table.

    python tools/bench_sync.py                  # Qwen3-1.7B shape, bf16, random weights, default buckets, cuda:0
    python tools/bench_sync.py --tiny           # a small shape on CPU (seconds)
    python tools/bench_sync.py --modes tensor --bucket-mb 512,1024,2048 --repeats 5
    python tools/bench_sync.py --tiny --verify  # each mode also verified (in the push; beside generation): the cost
    python tools/bench_sync.py --modes tensor --delta  # verified delta pushes after one lr-1e-6 step, against full

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
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.config.schema_rollout import WeightSyncConfig  # noqa: E402
from slime.engine.base import EngineLaunch  # noqa: E402
from slime.engine.hf.config import HFEngineConfig  # noqa: E402
from slime.engine.hf.engine import HFEngine  # noqa: E402
from slime.registry import WEIGHT_SYNC  # noqa: E402
from slime.sync.base import SyncContext  # noqa: E402
from slime.wire.tensors import Bucket, bucket_nbytes  # noqa: E402
from tools.bench_sync_model import (  # noqa: E402
    bucketed,
    copies_floor,
    model_config,
    random_weights,
    sync_floor,
    write_model_dir,
)

MODES = ("tensor", "distributed", "disk")
VERIFIED = {False: "verified in the push", True: "verified beside generation"}


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


def sync_context(engine: HFEngine, buckets: list[Bucket], work_dir: Path, *, verify: bool) -> SyncContext:
    """The bench's sync context: the engine's model, buckets of the sizes given, verified or not."""
    return SyncContext(
        source_checkpoint=str(engine.launch_spec.model_path),
        engine="hf",  # its record decides tensor mode's buffers (reused: EngineFacts.reuses_tensor_buffers)
        work_dir=str(work_dir),
        bucket_bytes=max(bucket_nbytes(b) for b in buckets),
        verify=verify,
    )


def bench_mode(
    mode: str, engine: HFEngine, buckets: list[Bucket], work_dir: Path, args, variant: Variant
) -> list[dict]:
    """`perf/*` of each timed push (after one warm-up, whose wall time each carries as `first_push`: it allocates
    the staging buffers and the engine opens them): the whole push, and the mode's own phases; `pipelined`
    false runs tensor mode one bucket at a time (its baseline); `verified` checks every push
    (rollout.weight_sync.verify); `delta` pushes deltas after one optimizer step each (`stepped`)."""
    context = sync_context(engine, buckets, work_dir, verify=variant.verified)
    context = dataclasses.replace(context, delta_full_every=1_000_000 if variant.delta else 0)
    sync = WEIGHT_SYNC.load(mode)([engine.client], context)
    sync.pipelined = variant.pipelined
    masters = [(name, t.float()) for bucket in buckets for name, t in bucket] if variant.delta else None
    pushes = []
    try:
        for version in range(1, args.repeats + 2):  # the first push warms up (group join, allocator, page cache)
            if masters is not None and version > 1:
                buckets = stepped(masters, bucket_nbytes(buckets[0]), seed=version)
            start = time.perf_counter()
            perf = sync.push(iter(buckets), weight_version=version)
            pushes.append({**perf, "wall": time.perf_counter() - start})
            if args.check:
                check_bit_exact(engine, buckets)
    finally:
        sync.close()
    return [{**push, "first_push": pushes[0]["wall"]} for push in pushes[1:]]


def bench_verification(mode: str, engine: HFEngine, buckets: list[Bucket], work_dir: Path, args) -> list[list[dict]]:
    """The timed pushes of one sync object taking turns (unverified, verified in the push, verified beside
    generation; each first in turn), so that a drift of the machine reaches the three alike. A push verified beside generation is timed
    until it returns; its check is then awaited (`verified`: its `check_wait` s, what a rollout shorter than it
    would wait) before the next push, as the loop awaits it before the step trains."""
    context = sync_context(engine, buckets, work_dir, verify=True)
    sync = WEIGHT_SYNC.load(mode)([engine.client], context)
    verifier, kinds = sync.verifier, [(False, False), (True, False), (True, True)]
    pushes: list[list[dict]] = [[] for _ in kinds]
    try:
        for version in range(1, args.repeats + 2):  # the first push of each kind warms up
            turn = [(kinds[(i + version) % 3], pushes[(i + version) % 3]) for i in range(3)]  # no kind always first
            for (verified, deferred), timed in turn:
                sync.verifier = verifier if verified else None
                sync.context = dataclasses.replace(context, defer_verify=deferred)
                start = time.perf_counter()
                perf = sync.push(iter(buckets), weight_version=version)
                wall = time.perf_counter() - start
                waited = time.perf_counter()
                perf.update(sync.verified())
                waited = time.perf_counter() - waited
                reported = time.perf_counter()
                engine.client.weight_digests()  # the engine's side of a check alone: digests of its whole model
                timed.append({**perf, "wall": wall, "check_wait": waited, "report": time.perf_counter() - reported})
    finally:
        sync.close()
    return [timed[1:] for timed in pushes]


def stepped(masters: list[tuple[str, torch.Tensor]], bucket_bytes: int, *, seed: int, lr: float = 1e-6) -> list[Bucket]:
    """One Adam step's change of the fp32 master weights (its first step moves every weight by lr against the sign of
    its gradient: random signs here), exported as the bf16 buckets a push carries."""
    gen = torch.Generator(device=masters[0][1].device).manual_seed(seed)
    for _, master in masters:
        signs = torch.randint(0, 2, master.shape, generator=gen, device=master.device, dtype=torch.int8)
        master.add_(signs.to(master.dtype) * (2 * lr) - lr)
    return bucketed([(name, m.to(torch.bfloat16)) for name, m in masters], bucket_bytes)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row: a mode at a bucket size, pipelined or not (tensor mode's baseline), verified or not."""

    mode: str
    mb: int
    pipelined: bool = True
    verified: bool = False
    deferred: bool = False  # verified beside the generation after the push (on_mismatch=fail), not inside it
    delta: bool = False

    @property
    def label(self) -> str:
        extra = [] if self.pipelined else ["one bucket at a time"]
        extra += [VERIFIED[self.deferred]] if self.verified else []
        extra += ["delta after one lr-1e-6 step"] if self.delta else []
        return f"{self.mode} ({', '.join(extra)})" if extra else self.mode


def variants(modes: list[str], bucket_mbs: list[int], verify: bool, delta: bool) -> list[list[Variant]]:
    """The rows to measure, in groups measured together: tensor mode also one bucket at a time (its baseline); with
    `verify` each mode's unverified row with the same push verified in it and beside generation, their pushes taking
    turns on one engine (`bench_verification`); with `delta` (tensor and distributed) also verified delta pushes."""
    out = []
    for mode in modes:
        for mb in bucket_mbs:
            plain, verified = Variant(mode, mb), Variant(mode, mb, verified=True)
            out.append([plain, verified, Variant(mode, mb, verified=True, deferred=True)] if verify else [plain])
            out += [[verified]] if delta and not verify else []
            out += [[Variant(mode, mb, verified=True, delta=True)]] if delta and mode != "disk" else []
            out += [[Variant(mode, mb, pipelined=False)]] if mode == "tensor" else []
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
    p.add_argument(
        "--verify",
        action="store_true",
        help="also measure each mode with every push verified (rollout.weight_sync.verify)",
    )
    p.add_argument(
        "--delta",
        action="store_true",
        help="also measure verified delta pushes, each after one simulated lr-1e-6 Adam step (rollout.weight_sync.delta)",
    )
    p.add_argument("--work-dir", default=None, help="model dir, disk-sync dirs and logs (default: a temp dir)")
    return p.parse_args()


def measure(named, device: torch.device, work: Path, args) -> list[tuple[Variant, int, list[dict]]]:
    """(variant, buckets, timed pushes) of every variant; one engine process per device it needs."""
    engine_device = "cuda" if device.type == "cuda" else "cpu"
    engines: dict[str, HFEngine] = {}
    rows = []
    try:
        mbs = [int(x) for x in args.bucket_mb.split(",")]
        for group in variants(args.modes.split(","), mbs, args.verify, args.delta):
            mode = group[0].mode
            gpu = None if engine_device == "cpu" else "0"
            if mode == "distributed" and engine_device == "cuda":
                if torch.cuda.device_count() < 2:
                    print("distributed: skipped, NCCL needs the engine on a second GPU (one visible)")
                    continue
                gpu = "1"
            key = gpu or "cpu"
            if key not in engines:
                engines[key] = start_engine(work / "model", work / "logs", engine_device, gpu)
            buckets = bucketed(named, group[0].mb << 20)
            if len(group) > 1:  # unverified, verified in the push, beside generation: taking turns
                timed = bench_verification(mode, engines[key], buckets, work / "sync", args)
            else:
                timed = [bench_mode(mode, engines[key], buckets, work / "sync", args, group[0])]
            rows += [(variant, len(buckets), pushes) for variant, pushes in zip(group, timed)]
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rows


def print_table(rows, nbytes: int, floor: float, copies: dict[int, float]) -> None:
    """One row per variant; `floor`: one device copy of every byte; `copies`: bucket MiB -> the two copies of a
    tensor-mode push (pack, load) in one process, with no hand-over; the first push (the warm-up) apart."""
    print(
        "\n| mode | bucket MiB | buckets | ms per full sync (median) | GB/s | min-max ms | pack ms | engines load ms "
        "| floor: device copy ms | x floor | both copies in one process ms | first push ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for variant, count, pushes in rows:
        walls = [p["wall"] for p in pushes]
        med = statistics.median(walls)
        both = f"{copies[variant.mb] * 1e3:.2f}" if variant.mode == "tensor" else "-"
        print(
            f"| {variant.label} | {variant.mb} | {count} | {med * 1e3:.1f} | {nbytes / med / 1e9:.2f} | "
            f"{min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f} | {median_ms(pushes, 'perf/update_weights_pack_time'):.1f} "
            f"| {median_ms(pushes, 'perf/update_weights_load_time'):.1f} | {floor * 1e3:.2f} | {med / floor:.1f} "
            f"| {both} | {median_ms(pushes, 'first_push'):.1f} |"
        )


def print_verification(rows) -> None:
    """The verified rows against the unverified row whose pushes they took turns with: what verification adds to a
    push (the median of each turn's difference), inside it (on_mismatch=resync) and beside generation
    (on_mismatch=fail, the default)."""
    plain = {(v.mode, v.mb): p for v, _, p in rows if v.pipelined and not v.verified}
    verified = [(v, p) for v, _, p in rows if v.verified and not v.delta and (v.mode, v.mb) in plain]
    if not verified:
        return
    print(
        "\n| mode | bucket MiB | verified | unverified ms | verified ms | added to the push ms | share of the "
        "unverified push | the check's own ms | awaited after the push ms | the engine's report ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant, pushes in verified:
        unverified = plain[(variant.mode, variant.mb)]
        base, wall = median_ms(unverified, "wall"), median_ms(pushes, "wall")
        added = statistics.median(v["wall"] - u["wall"] for v, u in zip(pushes, unverified)) * 1e3  # same turn
        print(
            f"| {variant.mode} | {variant.mb} | {VERIFIED[variant.deferred]} | {base:.1f} | {wall:.1f} "
            f"| {added:.1f} | {added / base:.1%} | {median_ms(pushes, 'perf/update_weights_verify_time'):.1f} "
            f"| {median_ms(pushes, 'check_wait'):.1f} | {median_ms(pushes, 'report'):.1f} |"
        )


def print_deltas(rows) -> None:
    """Each delta row against its mode's verified full row of the same call: bytes and time."""
    full = {(v.mode, v.mb): p for v, _, p in rows if v.verified and not v.deferred and not v.delta}
    deltas = [(v, p) for v, _, p in rows if v.delta and (v.mode, v.mb) in full]
    if not deltas:
        return
    print(
        "\n| mode | bucket MiB | full ms (verified) | delta ms (verified) | delta bytes / full bytes | changed elements |"
    )
    print("|---|---|---|---|---|---|")
    for variant, pushes in deltas:
        base = full[(variant.mode, variant.mb)]
        share = statistics.median(p["perf/update_weights_bytes"] for p in pushes) / base[0]["perf/update_weights_bytes"]
        changed = statistics.median(p["perf/update_weights_changed_fraction"] for p in pushes)
        print(
            f"| {variant.mode} | {variant.mb} | {median_ms(base, 'wall'):.1f} | {median_ms(pushes, 'wall'):.1f} "
            f"| {share:.2%} | {changed:.2%} |"
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
    mbs = [int(x) for x in args.bucket_mb.split(",")]
    copies = {mb: copies_floor(named, mb << 20, device, args.repeats) for mb in mbs} if "tensor" in args.modes else {}
    rows = measure(named, device, work, args)
    print_table(rows, nbytes, floor, copies)
    print_verification(rows)
    print_deltas(rows)
    print(f"\n{nbytes / 1e9:.3f} GB per sync; {args.repeats} timed syncs per row after one warm-up; work dir {work}")
    print("pack: flattening buckets into staging buffers; load: the engines' update calls (hand-over and copy);")
    print("the rest of a sync is pause, flush, the update session and continue. Pipelined tensor mode packs the")
    print("next bucket while the engines load one, so its pack and load overlap. First push: the warm-up push, which")
    print("allocates tensor mode's staging buffers and has the engine open them (later pushes reuse both).")
    if device.type == "cpu":
        print("(CPU: tensor mode hands buckets over as shared-memory segments; GPU: CUDA IPC handles)")


if __name__ == "__main__":
    main()
