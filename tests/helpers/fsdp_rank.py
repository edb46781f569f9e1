"""An fsdp training rank driven directly (no Ray): its setup, random samples and their data-parallel shards, one
rollout step in the driver's order, forward-only log-probs; a tensor-parallel group of ranks in processes."""

from __future__ import annotations

import os
import random

import torch
import torch.multiprocessing as mp

from slime.config import fill_derived
from slime.plan.validate import validate
from slime.rollout.postprocess import split_for_data_parallel
from slime.train.fsdp.backend import FSDPBackend
from slime.train.layout import RankLayout
from slime.train.train_setup import TrainSetup, needs_old_log_probs
from slime.types import Sample, TrainBatch
from tests.helpers.compose import typed_config


def make_setup(model_dir, overrides=()) -> TrainSetup:
    # a rank takes no logger: wandb's mode is off so that validation asks for no wandb package (the GPU machine's)
    cfg = typed_config(
        [f"model.hf_checkpoint={model_dir}", "checkpoint.ref_load=null", "logger.wandb.mode=disabled", *overrides]
    )
    derived = validate(cfg)
    return TrainSetup.from_run_config(fill_derived(cfg, derived), derived)


def make_samples(num: int, *, seed: int, vocab: int = 76) -> list[Sample]:
    """Random prompt/response token ids with varied lengths, some masked tokens, engine log-probs."""
    rng = random.Random(seed)
    samples = []
    for i in range(num):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(3, 7))]
        response = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 5))]
        s = Sample(
            index=i,
            group_index=i // 4,
            tokens=prompt + response,
            response_length=len(response),
            loss_mask=[1 if rng.random() > 0.2 else 0 for _ in response],
            rollout_log_probs=[-rng.random() * 3 for _ in response],
            reward=float(rng.random() > 0.5),
        )
        samples.append(s)
    return samples


def make_backend(setup: TrainSetup, *, rank: int = 0, layout: RankLayout | None = None, port: int = 0, cls=FSDPBackend):
    """A built backend rank (init() done) of a group laid out as `layout` (default: one rank)."""
    backend = cls(setup, rank=rank, layout=layout or RankLayout(dp=1), master_addr="127.0.0.1", master_port=port)
    backend.init()
    return backend


def train_rollout(backend, batch: TrainBatch, *, rollout_id: int = 0, update: bool = True) -> dict:
    """One rollout step on one actor rank, in the driver's order (slime.driver.loop.RunLoop.train)."""
    algo = backend.setup.algo
    backend.load_batch(rollout_id, batch)
    for which in backend.setup.frozen_checkpoints:  # the reference model, the distillation teacher
        backend.compute_log_probs(which)
    if needs_old_log_probs(algo, backend.setup.train.num_steps_per_rollout):
        backend.compute_log_probs("old")
    rollout_side = backend.compute_advantages()
    return {**backend.train(update=update), "rollout": rollout_side}


def log_probs(backend, batch: TrainBatch, which: str = "old") -> torch.Tensor:
    """Flat forward-only log-probs of every response token of `batch`."""
    backend.load_batch(0, batch)
    backend.compute_log_probs(which)
    return backend.columns[f"{which}_log_probs"]


def response_log_probs(backend, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The backend's own forward-only log-probs of `response` after `prompt` (its packed path), Tensor[R]."""
    sample = Sample(
        index=0,
        tokens=list(prompt) + list(response),
        response_length=len(response),
        loss_mask=[1] * len(response),
        reward=0.0,
    )
    batch = split_for_data_parallel([sample], [0.0], [0.0], step_sizes=[1], dp_size=1)[0]
    return log_probs(backend, batch).cpu()


def batches_for(samples, *, dp: int, k: int, balance_tokens: bool = False):
    rewards = [s.reward - 0.5 for s in samples]  # any fixed advantages: the split must not matter
    return split_for_data_parallel(
        samples,
        [s.reward for s in samples],
        rewards,
        step_sizes=[len(samples) // k] * k,
        dp_size=dp,
        balance_tokens=balance_tokens,
    )


TP_OVERRIDES = [
    "parallelism.micro_batch_size=3",
    "train.lr=1e-2",
    "algo.use_kl_loss=true",
    "algo.kl_loss_coef=0.1",
    "algo.entropy_coef=0.01",
]


def _tp_rank_main(rank, layout, port, setup, shards, out):
    if setup.device == "cuda":  # one GPU per rank, as Ray gives each training actor
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    torch.manual_seed(0)
    backend = make_backend(setup, rank=rank, layout=layout, port=port)
    shard = shards[layout.shard_of(rank)]
    before = log_probs(backend, shard).clone()
    result = train_rollout(backend, shard)
    full = {name: t.cpu().clone() for bucket in backend.export_weights(1 << 20) for name, t in bucket}
    sharded = sorted(n for n, p in backend.model.named_parameters() if hasattr(p, "placements"))
    torch.save(
        {"log_probs": before.cpu(), "result": result, "params": full, "sharded": sharded}, out / f"rank{rank}.pt"
    )
    backend.shutdown()


def run_tp_group(setup, samples, layout: RankLayout, tmp_path, port):
    tmp_path.mkdir(parents=True, exist_ok=True)
    shards = batches_for(samples, dp=layout.dp, k=2)
    if layout.world_size == 1:
        _tp_rank_main(0, layout, port, setup, shards, tmp_path)
    else:
        mp.spawn(_tp_rank_main, args=(layout, port, setup, shards, tmp_path), nprocs=layout.world_size, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(layout.world_size)]
