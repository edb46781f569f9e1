"""What the ranks of `tools/validate_multigpu.py` run: one process per rank (torch.multiprocessing spawn),
each building a real `TrainBackend` through `slime.train.base.get_backend_class`, as the runtime's actors do.

A rank's function takes (rank, Job) and returns a picklable dict, written to `<out>/<rank>.pt`; the
parent reads every rank's dict back (`run_ranks`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from slime.config.schema import AlgoConfig, CheckpointConfig, ModelConfig, TrainConfig
from slime.net import free_port
from slime.rollout.postprocess import split_for_data_parallel
from slime.run_schema import schema_class
from slime.train.layout import RankLayout
from slime.train.train_setup import TrainSetup
from slime.types import Sample, TrainBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """Model, precision, samples and tolerances of one device kind."""

    device: str  # cpu | cuda
    precision: str  # fp32 | bf16
    model: ModelConfig
    log_prob_tol: float  # mean |log-prob diff| (nats per token)
    grad_tol: float  # relative grad-norm difference
    num_samples: int
    prompt_len: tuple[int, int]  # token range of the random prompts
    response_len: tuple[int, int]
    max_tokens_per_gpu: int
    lr: float


def _engine_checksums(engine) -> dict[str, str]:
    """The hf engine's checksum per tensor (`/weights_checker`), SGLang's hash text."""
    return engine.client.check_weights("checksum")["ranks"][0]["checksums"]


def make_profile(device: str, models_dir: Path) -> Profile:
    """CUDA: Qwen3-0.6B's shape with 4 layers in bf16; CPU: the tiny_qwen3 shape in fp32."""
    if device == "cuda":
        model = ModelConfig(
            name="qwen3_0_6b_4layers", hf_checkpoint=str(models_dir / "qwen3_0_6b_4layers"), architecture="qwen3",
            num_layers=4, hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16, num_query_groups=8,
            kv_channels=128, vocab_size=151936, rotary_base=1_000_000.0, tie_word_embeddings=True,
            max_position_embeddings=40960, init_std=0.02,
        )  # fmt: skip
        return Profile(
            device=device, precision="bf16", model=model, log_prob_tol=0.02, grad_tol=0.05, num_samples=8,
            prompt_len=(16, 200), response_len=(8, 600), max_tokens_per_gpu=2048, lr=1e-5,
        )  # fmt: skip
    model = ModelConfig(
        name="tiny_qwen3", hf_checkpoint=str(models_dir / "tiny_qwen3"), architecture="qwen3", num_layers=2,
        hidden_size=64, ffn_hidden_size=192, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        vocab_size=80, rotary_base=10000.0, tie_word_embeddings=True, max_position_embeddings=512, init_std=0.08,
    )  # fmt: skip
    return Profile(
        device=device, precision="fp32", model=model, log_prob_tol=1e-5, grad_tol=1e-5, num_samples=8,
        prompt_len=(3, 7), response_len=(1, 5), max_tokens_per_gpu=24, lr=1e-2,
    )  # fmt: skip


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def describe_device(device: str) -> str:
    if device == "cpu":
        return "CPU (gloo)"
    n = gpu_count()
    return f"{n}x {torch.cuda.get_device_name(0)}" if n else "no CUDA device"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """What every rank of one spawned group needs."""

    profile: Profile
    backend: str = "megatron"
    dp: int = 1
    tp: int = 1
    pp: int = 1
    num_syncs: int = 1
    log_dir: str = ""
    master_port: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def layout(self) -> RankLayout:
        return RankLayout(dp=self.dp, tp=self.tp, pp=self.pp)


def run_ranks(fn, job: Job, world_size: int, timeout_s: float, log_prefix: str) -> list[dict]:
    """`fn(rank, job)` on `world_size` spawned processes (GPU `rank` each on CUDA); every rank's dict.
    Each rank's stdout and stderr go to `<log_prefix>.rank<r>.log`."""
    import tempfile

    job = dataclasses.replace(job, master_port=free_port())
    Path(log_prefix).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="validate_ranks_") as out:
        args = (fn, job, out, log_prefix)
        context = mp.start_processes(_rank_main, args=args, nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                for proc in context.processes:
                    proc.kill()
                raise TimeoutError(
                    f"{fn.__name__} on {world_size} rank(s) ran past {timeout_s:.0f}s; see {log_prefix}.*"
                )
        return [torch.load(f"{out}/{rank}.pt", weights_only=False) for rank in range(world_size)]


def _rank_main(rank: int, fn, job: Job, out: str, log_prefix: str) -> None:
    log = os.open(f"{log_prefix}.rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if job.profile.device == "cuda":
        torch.cuda.set_device(rank)
    torch.manual_seed(0)
    torch.save(fn(rank, job), f"{out}/{rank}.pt")


# ---- setups, samples, batches -------------------------------------------------------------------------
def train_setup(job: Job, *, num_steps: int = 1) -> TrainSetup:
    """A GRPO actor setup without KL (as `tests.helpers.megatron_standalone` builds), for `job`'s layout."""
    p = job.profile
    parallelism = schema_class("parallelism")(
        backend=job.backend, tp=job.tp, pp=job.pp, max_tokens_per_gpu=p.max_tokens_per_gpu
    )
    return TrainSetup(
        model=p.model,
        parallelism=parallelism,
        train=TrainConfig(num_rollout=1, lr=p.lr, num_steps_per_rollout=num_steps),
        algo=AlgoConfig(name="grpo", use_kl_loss=False, kl_loss_coef=0.0),
        checkpoint=CheckpointConfig(),
        device=p.device,
        precision=p.precision,
        temperature=1.0,
        max_response_len=1 << 20,
        seed=1234,
        num_optimizer_steps=1000,
    )


def build(job: Job, rank: int, *, num_steps: int = 1):
    """The job's backend rank, built (init() done)."""
    from slime.train.base import get_backend_class

    cls = get_backend_class(job.backend)
    backend = cls(
        train_setup(job, num_steps=num_steps),
        rank=rank,
        layout=job.layout(),
        master_addr="127.0.0.1",
        master_port=job.master_port,
    )
    backend.init()
    return backend


def samples(profile: Profile, seed: int = 0) -> list[Sample]:
    """Random prompt + response token ids; rewards alternate 1 / 0 (advantages +1 / -1)."""
    rng = random.Random(seed)
    out = []
    for i in range(profile.num_samples):
        prompt = [rng.randrange(4, profile.model.vocab_size) for _ in range(rng.randint(*profile.prompt_len))]
        response = [rng.randrange(4, profile.model.vocab_size) for _ in range(rng.randint(*profile.response_len))]
        out.append(
            Sample(index=i, tokens=prompt + response, response_length=len(response), loss_mask=[1] * len(response),
                   reward=float(i % 2 == 0))
        )  # fmt: skip
    return out


def batches(records: list[Sample], *, dp: int, num_steps: int) -> list[TrainBatch]:
    """The data-parallel shards of one rollout step of `records` in `num_steps` optimizer steps."""
    advantages = [1.0 if s.reward else -1.0 for s in records]
    return split_for_data_parallel(
        records,
        [s.reward for s in records],
        advantages,
        step_sizes=[len(records) // num_steps] * num_steps,
        dp_size=dp,
    )


# ---- rank functions -----------------------------------------------------------------------------------
def megatron_rank(rank: int, job: Job) -> dict:
    """Forward-only log-probs, then one optimizer step, of one shard (every rank gets the same: dp=1)."""
    backend = build(job, rank)
    batch = batches(samples(job.profile), dp=1, num_steps=1)[0]
    backend.load_batch(0, batch)
    backend.compute_log_probs("old")
    log_probs = backend.columns["old_log_probs"].float().cpu()
    backend.compute_advantages()
    step = backend.train()["steps"][0]
    backend.shutdown()
    return {"log_probs": log_probs, "grad_norm": step["train/grad_norm"], "pg_loss": step.get("train/pg_loss")}


def fsdp_rank(rank: int, job: Job) -> dict:
    """Log-probs of this rank's shard by sample index, then two optimizer steps' metrics."""
    backend = build(job, rank, num_steps=2)
    batch = batches(samples(job.profile), dp=job.dp, num_steps=2)[job.layout().shard_of(rank)]
    backend.load_batch(0, batch)
    backend.compute_log_probs("old")
    flat = backend.columns["old_log_probs"].float().cpu()
    log_probs = dict(zip(batch.sample_indices, torch.split(flat, batch.response_lengths)))
    backend.compute_advantages()
    steps = backend.train()["steps"]
    backend.shutdown()
    return {"log_probs": log_probs, "steps": steps}


def sync_rank(rank: int, job: Job) -> dict:
    """Trainer rank 0 (GPU 0) moves its weights by one step, then `distributed`-syncs them into an hf engine
    (GPU 1) `job.num_syncs` times; the engine's checksum per tensor (`/weights_checker`) is compared with the
    trainer's export."""
    from slime.engine.base import EngineLaunch
    from slime.engine.hf.config import HFEngineConfig
    from slime.engine.hf.engine import HFEngine
    from slime.engine.hf.weight_checker import tensor_checksum
    from slime.sync.base import SyncContext
    from slime.wire import tensors

    p = job.profile
    backend = build(job, rank)
    batch = batches(samples(p), dp=1, num_steps=1)[0]
    backend.load_batch(0, batch)
    backend.compute_advantages()
    backend.train()  # the synced weights now differ from the checkpoint the engine started from
    dtype = "bfloat16" if p.precision == "bf16" else "float32"
    launch = EngineLaunch(
        rank=0, model_path=p.model.hf_checkpoint, host="127.0.0.1", seed=0, device=p.device,
        gpu_ids=("1",) if p.device == "cuda" else (), log_dir=job.log_dir, startup_timeout_s=600,
    )  # fmt: skip
    engine = HFEngine(launch, HFEngineConfig(max_batch_size=4, num_threads=1, dtype=dtype))
    engine.start()
    bucket_bytes = 512 << 20
    try:
        context = SyncContext(source_checkpoint=p.model.hf_checkpoint, work_dir=job.log_dir, bucket_bytes=bucket_bytes)
        before = _engine_checksums(engine)  # the checkpoint's weights
        backend.connect_weight_sync("distributed", [engine.url], context)
        times, moved = [], 0.0
        for version in range(1, job.num_syncs + 1):
            perf = backend.update_weights(weight_version=version)
            times.append(perf["perf/update_weights_time"])
            moved = perf["perf/update_weights_bytes"]
        got, version = _engine_checksums(engine), engine.client.get_weight_version()
        engine_dtype = tensors.parse_dtype(dtype)
        expected = {n: tensor_checksum(t.to(engine_dtype)) for b in backend.export_weights(bucket_bytes) for n, t in b}
        mismatched = sum(got.get(n) != h for n, h in expected.items()) + len(set(got) - set(expected))
        changed = sum(before.get(n) != h for n, h in got.items())
    finally:
        backend.close_weight_sync()
        engine.shutdown()
        backend.shutdown()
    return {
        "times": times,
        "bytes": moved,
        "mismatched": float(mismatched),
        "num_tensors": len(expected),
        "changed": float(changed),
        "engine_version": version,
    }
