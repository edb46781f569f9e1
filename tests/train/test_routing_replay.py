"""MoE routing replay (algo.routing_replay) on model=tiny_qwen3_moe: the hf engine returns each token's experts,
both backends force exactly those in every forward of the policy, and the trainer/engine log-prob gap shrinks.

The engine serves in bf16 and the trainer runs in fp32, so some near-tie routes differ between them (4-5% of the
tokens here), as between SGLang's kernels and a trainer's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slime.models.moe.hf_routers import RouterTap
from slime.models.moe.routes import decode_routes, encode_routes, stream_routes
from slime.net import free_port
from slime.train.layout import RankLayout
from tests.helpers.fsdp_rank import batches_for, make_backend, make_setup, train_rollout
from tests.helpers.moe_rollout import engine_samples, expert_sets_equal, sample_routes, tiny_moe


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return tiny_moe(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def bf16_samples(moe):
    return engine_samples(moe.hf_checkpoint, dtype=torch.bfloat16)


def replaying(moe, mode: str, *extra: str):
    return make_setup(moe.hf_checkpoint, ["model=tiny_qwen3_moe", f"algo.routing_replay={mode}", *extra])


def engine_log_probs(samples) -> torch.Tensor:
    return torch.tensor([x for s in samples for x in s.rollout_log_probs])


def test_routes_round_trip_and_a_size_mismatch_names_the_shapes():
    routes = np.arange(24, dtype=np.int32).reshape(3, 2, 4) % 5
    assert np.array_equal(decode_routes(encode_routes(routes), num_tokens=4, num_layers=2, topk=4), routes)
    assert np.array_equal(
        decode_routes(encode_routes(routes[1:]), num_tokens=4, num_layers=2, topk=4, start_len=1), routes[1:]
    )
    with pytest.raises(ValueError, match=r"expected 3 rows x 2 MoE layers x top-2 = 12"):
        decode_routes(encode_routes(routes), num_tokens=4, num_layers=2, topk=2)


def test_the_engines_routes_are_the_models_own_choice_for_every_fed_token(moe, tmp_path):
    """fp32 engine and fp32 trainer: the trainer's free choice equals the returned routes row for row (prompt rows of
    a left-padded batch prefill, then one per decoded token, the last token never fed)."""
    samples = engine_samples(moe.hf_checkpoint, dtype=torch.float32, num=6, max_new=9)
    backend = make_backend(replaying(moe, "none"))
    batch = batches_for(samples, dp=1, k=1)[0]
    backend.load_batch(0, batch)
    tap = RouterTap(backend.model)
    with torch.no_grad(), tap.capture():
        backend._forward(backend.model, batch, list(range(len(batch))), with_entropy=False)
    chosen = tap.take().cpu()
    routes = sample_routes(samples, moe)
    assert [r.shape[0] for r in routes] == [len(s.tokens) - 1 for s in samples]
    expected = torch.from_numpy(stream_routes(routes, moe.num_experts)).long()
    fed = torch.ones(len(expected), dtype=torch.bool)
    fed[np.cumsum([len(s.tokens) for s in samples]) - 1] = False  # each sample's last token: filler rows
    assert torch.equal(chosen[fed], expected[fed])


def test_fsdp_replays_the_engines_routes_and_the_log_prob_gap_shrinks(moe, bf16_samples):
    batch = batches_for(bf16_samples, dp=1, k=1)[0]
    engine = engine_log_probs(bf16_samples)
    free = make_backend(replaying(moe, "none", "algo.use_tis=true"))
    free.load_batch(0, batch)
    free.compute_log_probs("old")
    gap_free = float((free.columns["old_log_probs"] - engine).abs().mean())

    replayed = make_backend(replaying(moe, "rollout", "algo.use_tis=true"))
    replayed.load_batch(0, batch)
    tap = RouterTap(replayed.model)  # sees what the routers hand to the experts, after the replay hooks
    with tap.capture():
        replayed.compute_log_probs("old")
    expected = torch.from_numpy(stream_routes(sample_routes(bf16_samples, moe), moe.num_experts)).long()
    assert torch.equal(tap.take().cpu(), expected)
    gap = float((replayed.columns["old_log_probs"] - engine).abs().mean())
    free_routes = RouterTap(free.model)
    with torch.no_grad(), free_routes.capture():
        free._forward(free.model, batch, list(range(len(batch))), with_entropy=False)
    differ = float((~expert_sets_equal(free_routes.take().cpu(), expected)).float().mean())
    print(f"fsdp: {differ:.1%} of token rows route differently; |trainer - engine| {gap_free:.5f} -> {gap:.5f}")
    assert differ > 0.01  # the setting has real mismatches to remove
    assert gap < 0.75 * gap_free
    with tap.capture():  # the training forwards replay them too
        replayed.compute_advantages()
        replayed.train()
    assert torch.equal(tap.take().cpu(), expected)


def test_fsdp_train_mode_replays_the_log_prob_pass_after_the_weights_moved(moe, bf16_samples):
    """routing_replay=train: two optimizer steps; the second step's forwards use the first pass's routes."""
    setup = replaying(moe, "train", "train.num_steps_per_rollout=2", "train.lr=0.05")
    backend = make_backend(setup)
    batch = batches_for(bf16_samples, dp=1, k=2)[0]
    tap = RouterTap(backend.model)
    with tap.capture():
        train_rollout(backend, batch)
    recorded = backend.routes.recorded
    assert len(recorded) == 2  # one micro-batch per step
    taken = tap.take()
    log_prob_pass = torch.cat([recorded[key] for key in recorded])
    assert torch.equal(taken[: len(log_prob_pass)], log_prob_pass)  # the log-prob pass routed freely
    assert torch.equal(taken[len(log_prob_pass) :], log_prob_pass)  # and training replayed it, step 2 included


def megatron_backend(setup):
    pytest.importorskip("megatron.core")
    from slime.train.megatron.backend import MegatronBackend

    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    backend.init()
    return backend


def megatron_choices(backend) -> list[torch.Tensor]:
    """Hooks on every megatron router keeping each forward's chosen experts, `[tokens, layers, k]` per forward."""
    from slime.train.megatron.routes import moe_routers

    routers = sorted(moe_routers(backend.model[0]), key=lambda r: r.layer_number)
    seen: list[list[torch.Tensor]] = [[] for _ in routers]
    k = backend.setup.model.moe_router_topk

    def keep(layer):
        return lambda module, args, out: seen[layer].append(out[1].float().topk(k, dim=-1).indices.cpu())

    for layer, router in enumerate(routers):
        router.register_forward_hook(keep(layer))
    return seen


def test_megatron_replays_the_engines_routes_and_the_log_prob_gap_shrinks(moe, bf16_samples):
    from slime.train.megatron import parallel

    batch = batches_for(bf16_samples, dp=1, k=1)[0]
    engine = engine_log_probs(bf16_samples)
    gaps = {}
    expected = torch.from_numpy(stream_routes(sample_routes(bf16_samples, moe), moe.num_experts)).long()
    for mode in ("none", "rollout"):
        backend = megatron_backend(replaying(moe, mode, "algo.use_tis=true", "parallelism=megatron"))
        try:
            seen = megatron_choices(backend) if mode == "rollout" else None
            backend.load_batch(0, batch)
            backend.compute_log_probs("old")
            gaps[mode] = float((backend.columns["old_log_probs"].cpu() - engine).abs().mean())
            if seen is not None:
                chosen = torch.stack([torch.cat(layer) for layer in seen], dim=1)
                assert expert_sets_equal(chosen, expected).all()
                backend.compute_advantages()
                backend.train()
                trained = torch.stack([torch.cat(layer) for layer in seen], dim=1)[len(expected) :]
                assert expert_sets_equal(trained, expected).all()
        finally:
            parallel.destroy()
    print(f"megatron: |trainer - engine| {gaps['none']:.5f} -> {gaps['rollout']:.5f}")
    assert gaps["rollout"] < 0.75 * gaps["none"]


def test_megatron_train_mode_replays_the_log_prob_pass_after_the_weights_moved(moe, bf16_samples):
    from slime.train.megatron import parallel

    setup = replaying(moe, "train", "parallelism=megatron", "train.num_steps_per_rollout=2", "train.lr=0.05")
    backend = megatron_backend(setup)
    try:
        seen = megatron_choices(backend)
        train_rollout(backend, batches_for(bf16_samples, dp=1, k=2)[0])
        passes = torch.stack([torch.cat(layer) for layer in seen], dim=1)
        recorded = torch.cat(
            [
                torch.stack([by_layer[n] for n in sorted(by_layer)], dim=1).cpu()
                for by_layer in backend.routes.recorded.values()
            ]
        )
        assert len(backend.routes.recorded) == 2 and passes.shape[0] == 2 * recorded.shape[0]
        assert expert_sets_equal(passes[: len(recorded)], recorded).all()
        assert expert_sets_equal(passes[len(recorded) :], recorded).all()
    finally:
        parallel.destroy()
