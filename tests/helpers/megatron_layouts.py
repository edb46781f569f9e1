"""The megatron backend's parallel layouts against one rank: each layout's ranks spawned (gloo on CPU, NCCL with
one GPU each on CUDA), forward-only log-probs of one shard, then one optimizer step; the tiny model options the
layout tests build (the MoE families with a random expert-score bias, so that it chooses experts)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

from slime.assets.tiny_model import create_tiny_model
from slime.train.layout import RankLayout
from slime.train.megatron.backend import MegatronBackend
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup, train_rollout
from tests.helpers.megatron_checkpoints import with_random_expert_bias

RANK_DIMS = {field.name for field in dataclasses.fields(RankLayout)}


def tiny_option_dir(option: str, overrides: list[str], root) -> str:
    """The tiny `option` (with `overrides`) created under `root`; its routers' expert-score bias, where it has one,
    made random."""
    model = typed_config([f"model={option}", *overrides]).model
    path = str(create_tiny_model(model, root))
    with_random_expert_bias(dataclasses.replace(model, hf_checkpoint=path))
    return path


def _one_layout(rank, layout, port, setup, batch) -> dict:
    """Build the layout's rank, log-probs then one rollout step; megatron's groups are torn down after
    (the process group stays for the next layout)."""
    from megatron.core import parallel_state as ps

    backend = MegatronBackend(setup, rank=rank, layout=layout, master_addr="127.0.0.1", master_port=port)
    backend.init()
    backend.load_batch(0, batch)
    backend.compute_log_probs("old")
    log_probs = backend.columns["old_log_probs"].clone().cpu()
    steps = train_rollout(backend, batch)["steps"]
    ps.destroy_model_parallel()
    return {"log_probs": log_probs, "steps": steps}


def _rank_main(rank, cases, port, out):
    if any(setup.device == "cuda" for _, setup, _ in cases.values()):
        # one GPU per rank (megatron's import has initialised CUDA by now: CUDA_VISIBLE_DEVICES would be too late)
        torch.cuda.set_device(rank)
    results = {}
    for name, (layout, setup, shards) in cases.items():
        result = _one_layout(rank, layout, port, setup, shards[layout.shard_of(rank)])
        if rank == layout.owner_of(0):
            results[name] = result
    torch.save(results, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def single_rank(setup, batch, port: int) -> dict:
    """The reference: one rank, in this process."""
    result = _one_layout(0, RankLayout(dp=1), port, setup, batch)
    torch.distributed.destroy_process_group()
    return result


def many_ranks(cases: dict, tmp_path, port: int, world: int = 2) -> dict:
    """Each case (name -> (layout, setup, data-parallel shards)) on `world` spawned ranks, one after
    another in the same processes."""
    out = tmp_path / "results"
    mp.spawn(_rank_main, args=(cases, port, str(out)), nprocs=world, join=True)
    merged = {}
    for rank in range(world):
        merged.update(torch.load(f"{out}.{rank}", weights_only=False))
    return merged


def assert_layouts_equal_one_rank(model_dir: str, base: list[str], layouts: dict, tmp_path, port: int) -> None:
    """Each layout (name -> parallel sizes, "dp" among them, and other parallelism keys) against one rank on the same 8 samples: the owner
    rank's log-probs to 1e-5, the first step's grad norm and pg_loss to 1e-4 (relative). `base`: the overrides
    both share (with a cuda cluster, every rank on its own GPU)."""
    samples = make_samples(8, seed=3)
    batch = batches_for(samples, dp=1, k=1)[0]

    one = single_rank(make_setup(model_dir, base), batch, port)
    by_sample = dict(zip(batch.sample_indices, torch.split(one["log_probs"], batch.response_lengths)))
    cases = {}
    for name, sizes in layouts.items():
        dims = {name: size for name, size in sizes.items() if name in RANK_DIMS}
        layout = RankLayout(**{"dp": 1, **dims})
        overrides = [f"parallelism.{k}={str(v).lower()}" for k, v in sizes.items() if k != "dp"]
        setup = make_setup(model_dir, [*base, "cluster.actor.num_gpus_per_node=2", *overrides])
        cases[name] = (layout, setup, batches_for(samples, dp=layout.dp, k=1))
    results = many_ranks(cases, tmp_path, port + 1)
    for name, (_, _, shards) in cases.items():
        many = results[name]
        expected = torch.cat([by_sample[i] for i in shards[0].sample_indices])  # the owner's shard
        torch.testing.assert_close(
            many["log_probs"], expected, rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
        grad_norm, one_norm = many["steps"][0]["train/grad_norm"], one["steps"][0]["train/grad_norm"]
        assert grad_norm == pytest.approx(one_norm, rel=1e-4), f"{name}: grad norm {grad_norm} vs one rank's {one_norm}"
        pg_loss = many["steps"][0]["train/pg_loss"]
        assert pg_loss == pytest.approx(one["steps"][0]["train/pg_loss"], rel=1e-4, abs=1e-6), name
