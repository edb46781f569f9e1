"""The megatron backend on CPU over gloo: every parallel layout equals the single-rank one.

Each case spawns the layout's ranks, computes forward-only log-probs of one shard, then runs one
optimizer step; the owner rank's log-probs must equal the single rank's to 1e-5 and the step's grad
norm to 1e-4 (relative). Layouts: TP=2, PP=2, CP=2 on the tiny dense model; EP=2 on the tiny MoE; EP=2 and PP=2
on the tiny GLM-4.5.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from slime.assets.tiny_model import create_tiny_model  # noqa: E402
from slime.train.layout import RankLayout  # noqa: E402
from slime.train.megatron.backend import MegatronBackend  # noqa: E402
from tests.helpers.compose import typed_config  # noqa: E402
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup, train_rollout  # noqa: E402
from tests.helpers.megatron_checkpoints import with_random_expert_bias  # noqa: E402


def _one_layout(rank, layout, port, setup, batch) -> dict:
    """Build the layout's rank, log-probs then one rollout step; megatron's groups are torn down after
    (the gloo world stays for the next layout)."""
    from megatron.core import parallel_state as ps

    backend = MegatronBackend(setup, rank=rank, layout=layout, master_addr="127.0.0.1", master_port=port)
    backend.init()
    backend.load_batch(0, batch)
    backend.compute_log_probs("old")
    log_probs = backend.columns["old_log_probs"].clone()
    steps = train_rollout(backend, batch)["steps"]
    ps.destroy_model_parallel()
    return {"log_probs": log_probs, "steps": steps}


def _rank_main(rank, cases, port, out):
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


LAYOUTS = {
    "dense": {"tp2": {"tp": 2}, "pp2": {"pp": 2}, "cp2": {"cp": 2}},
    # experts split over the two data-parallel ranks (megatron needs sequence parallel, not on CPU, for ep with tp)
    "moe": {"ep2": {"dp": 2, "ep": 2}},
    # GLM-4.5's layers (a dense first layer; sigmoid router with a random expert-score bias, a shared expert); pp 2
    # puts the dense layer and the MoE layer on different stages
    "glm4_moe": {"ep2": {"dp": 2, "ep": 2}, "pp2": {"pp": 2}},
}
MODEL_OF_KIND = {"dense": None, "moe": "tiny_qwen3_moe", "glm4_moe": "tiny_glm4_moe"}


def model_dir_of(kind: str, tiny_model_dir: str, root) -> str:
    option = MODEL_OF_KIND[kind]
    if option is None:
        return tiny_model_dir
    model = typed_config([f"model={option}"]).model
    path = str(create_tiny_model(model, root / kind))
    if kind == "glm4_moe":
        with_random_expert_bias(dataclasses.replace(model, hf_checkpoint=path))
    return path


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_layouts_equal_single_rank(kind, tiny_model_dir, tmp_path):
    model_dir = model_dir_of(kind, tiny_model_dir, tmp_path)
    option = MODEL_OF_KIND[kind]
    base = ([f"model={option}"] if option else []) + [
        "parallelism=megatron",
        "parallelism.max_tokens_per_gpu=24",
        "train.lr=1e-2",
    ]
    samples = make_samples(8, seed=3)
    batch = batches_for(samples, dp=1, k=1)[0]
    port = 29600 + 10 * list(LAYOUTS).index(kind)
    one = single_rank(make_setup(model_dir, base), batch, port)
    by_sample = dict(zip(batch.sample_indices, torch.split(one["log_probs"], batch.response_lengths)))
    cases = {}
    for name, sizes in LAYOUTS[kind].items():
        layout = RankLayout(**{"dp": 1, **sizes})
        overrides = [f"parallelism.{k}={v}" for k, v in sizes.items() if k != "dp"]
        setup = make_setup(model_dir, [*base, "cluster.actor.num_gpus_per_node=2", *overrides])
        cases[name] = (layout, setup, batches_for(samples, dp=layout.dp, k=1))
    results = many_ranks(cases, tmp_path, port + 1)
    for name, (_, _, shards) in cases.items():
        many = results[name]
        expected = torch.cat([by_sample[i] for i in shards[0].sample_indices])  # the owner's shard
        torch.testing.assert_close(many["log_probs"], expected, rtol=0, atol=1e-5, msg=name)
        grad_norm = many["steps"][0]["train/grad_norm"]
        assert grad_norm == pytest.approx(one["steps"][0]["train/grad_norm"], rel=1e-4), name
        pg_loss = many["steps"][0]["train/pg_loss"]
        assert pg_loss == pytest.approx(one["steps"][0]["train/pg_loss"], rel=1e-4, abs=1e-6), name


@pytest.mark.slow
def test_virtual_pipeline_stages_equal_single_rank(tmp_path):
    """pp=4 with two virtual stages per rank (interleaved 1F1B) on an 8-layer model, four ranks.

    (pp=2 with virtual stages is rejected on CPU: both pipeline neighbours are the same gloo peer, and
    the interleaved schedule's batched sends in both directions then pair up wrongly.)
    """
    base = ["model.num_layers=8", "parallelism=megatron", "parallelism.max_tokens_per_gpu=24", "train.lr=1e-2"]
    model_dir = str(create_tiny_model(typed_config(base[:1]).model, tmp_path / "deep"))
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    one = single_rank(make_setup(model_dir, base), batch, 29640)
    wide = ["cluster.num_gpus_per_node=8", "cluster.actor.num_gpus_per_node=4", "parallelism.pp=4"]
    setup = make_setup(model_dir, [*base, *wide, "parallelism.vpp=2"])
    results = many_ranks({"vpp": (RankLayout(dp=1, pp=4), setup, [batch])}, tmp_path, 29641, world=4)
    torch.testing.assert_close(results["vpp"]["log_probs"], one["log_probs"], rtol=0, atol=1e-5)
    grad_norm = results["vpp"]["steps"][0]["train/grad_norm"]
    assert grad_norm == pytest.approx(one["steps"][0]["train/grad_norm"], rel=1e-4)
