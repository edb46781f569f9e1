"""The fsdp backend driven directly (no Ray): data-parallel exactness and the first-step invariants."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from slime.rollout.postprocess import split_for_data_parallel
from slime.train.layout import RankLayout
from slime.types import Sample
from tests.helpers.fsdp_rank import batches_for, log_probs, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.megatron_checkpoints import make_checkpoint, with_random_expert_bias


def _rank_main(rank, world, port, setup, batches, out):
    torch.manual_seed(0)
    backend = make_backend(setup, rank=rank, layout=RankLayout(dp=world), port=port)
    result = train_rollout(backend, batches[rank])
    if rank == 0:
        torch.save(
            {"result": result, "params": {n: p.detach().clone() for n, p in backend.model.named_parameters()}}, out
        )
    backend.shutdown()


def train_once(setup, batches, world, tmp_path, port):
    out = tmp_path / f"world{world}.pt"
    if world == 1:
        _rank_main(0, 1, port, setup, batches, out)
    else:
        mp.spawn(_rank_main, args=(world, port, setup, batches, out), nprocs=world, join=True)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize(
    "per_token,split", [(False, "micro_batch_size=3"), (True, "micro_batch_size=3"), (True, "max_tokens_per_gpu=16")]
)
def test_two_data_parallel_ranks_match_one(tiny_model_dir, tmp_path, per_token, split):
    """By tokens, the ranks' shards pack into different bin counts: the shorter one runs empty micro-batches."""
    overrides = [f"parallelism.{split}", f"algo.calculate_per_token_loss={per_token}"]
    setup = make_setup(tiny_model_dir, overrides)
    samples = make_samples(16, seed=1)
    one = train_once(setup, batches_for(samples, dp=1, k=2), 1, tmp_path, 29511)
    by_tokens = "max_tokens" in split  # dealt to the ranks by token count, as the runtime does then
    two = train_once(
        setup, batches_for(samples, dp=2, k=2, balance_tokens=by_tokens), 2, tmp_path, 29512 + per_token + 2 * by_tokens
    )
    for key in ("train/pg_loss", "train/grad_norm", "train/pg_clipfrac", "train/train_rollout_logprob_abs_diff"):
        for s1, s2 in zip(one["result"]["steps"], two["result"]["steps"]):
            assert s1[key] == pytest.approx(s2[key], rel=1e-4, abs=1e-6), key
    # Adam's update is about lr per element; fp32 summation order may move an element whose gradient is
    # near zero by a small fraction of one update, so compare at 1% of lr.
    for name, p in one["params"].items():
        torch.testing.assert_close(p, two["params"][name], rtol=1e-4, atol=0.01 * setup.train.lr)


def test_dealing_by_tokens_balances_the_ranks():
    """Each sample once, G/dp per rank per step, in batch order within a rank, and token totals within the
    longest sample of each other (round-robin can be off by far more on ragged RL lengths)."""
    samples = make_samples(16, seed=11)
    for sample, extra in zip(samples, [0, 40, 3, 90, 1, 0, 55, 7, 2, 31, 0, 64, 9, 5, 70, 4]):
        sample.tokens = [1] * extra + sample.tokens  # a longer prompt
    batches = batches_for(samples, dp=4, k=2, balance_tokens=True)
    seen = sorted(i for b in batches for i in b.sample_indices)
    assert seen == sorted(s.index for s in samples)
    longest = max(len(s.tokens) for s in samples)
    for step in range(2):
        totals = [sum(len(t) for t, st in zip(b.tokens, b.step_ids) if st == step) for b in batches]
        assert all(sum(1 for st in b.step_ids if st == step) == 2 for b in batches)
        assert max(totals) - min(totals) <= longest
    for b in batches:
        assert b.step_ids == sorted(b.step_ids)
        order = [next(j for j, s in enumerate(samples) if s.index == i) for i in b.sample_indices]
        assert order == sorted(order)


def test_first_step_invariants_and_update(tiny_model_dir, tmp_path):
    """Step 0 of a rollout: ρ ≡ 1 so ppo_kl = 0 and clipfrac = 0; actor = ref so kl_loss = 0."""
    setup = make_setup(
        tiny_model_dir,
        ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.1", f"checkpoint.ref_load={tiny_model_dir}", "train.lr=1e-2"],
    )
    samples = make_samples(8, seed=2)
    backend = make_backend(setup)
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    steps = train_rollout(backend, batches_for(samples, dp=1, k=2)[0])["steps"]
    assert steps[0]["train/ppo_kl"] == 0.0 and steps[0]["train/kl_loss"] == 0.0 and steps[0]["train/pg_clipfrac"] == 0.0
    assert steps[1]["train/ppo_kl"] != 0.0 and steps[1]["train/kl_loss"] > 0.0  # the first step moved the policy
    assert any(not torch.equal(before[n], p) for n, p in backend.model.named_parameters())
    assert steps[0]["train/grad_norm"] > 0


def test_grpo_step_raises_probability_of_rewarded_response(tiny_model_dir):
    """One sample with advantage +1 and one with -1 on the same prompt: the first becomes likelier."""
    setup = make_setup(
        tiny_model_dir,
        [
            "train.lr=1e-2",
            "rollout.batch_size=1",
            "rollout.n_samples_per_prompt=2",
            "train.global_batch_size=2",
            "train.num_steps_per_rollout=1",
        ],
    )
    prompt = [1, 5, 11, 12, 13, 34, 62, 2, 1, 6]
    good, bad = (
        Sample(index=0, tokens=prompt + [30], response_length=1, loss_mask=[1], reward=1.0),
        Sample(index=1, tokens=prompt + [40], response_length=1, loss_mask=[1], reward=0.0),
    )
    batch = split_for_data_parallel([good, bad], [1.0, 0.0], [1.0, -1.0], step_sizes=[2], dp_size=1)[0]
    backend = make_backend(setup)
    before = log_probs(backend, batch).tolist()
    train_rollout(backend, batch)
    after = log_probs(backend, batch).tolist()
    assert after[0] > before[0] and after[1] < before[1]


def test_a_moe_export_carries_the_checkpoints_names_and_values(tmp_path):
    """What `save_pretrained` writes (experts one by one, the router's expert bias), whatever transformers holds
    in memory: SGLang, vLLM and the hf engine load these names."""
    from safetensors.torch import load_file

    source = make_checkpoint("glm4_moe", tmp_path)
    with_random_expert_bias(source)
    backend = make_backend(make_setup(source.hf_checkpoint, ["model=tiny_glm4_moe"]))
    exported = {name: t for bucket in backend.export_weights(1 << 14) for name, t in bucket}
    backend.shutdown()
    saved = load_file(f"{source.hf_checkpoint}/model.safetensors")
    assert exported.keys() == saved.keys() and "model.layers.1.mlp.experts.3.down_proj.weight" in exported
    assert all(torch.equal(exported[name], value) for name, value in saved.items())
