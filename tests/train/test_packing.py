"""Packed micro-batches, micro-batching by tokens and chunked log-probs of the fsdp backend (CPU, fp32)."""

from __future__ import annotations

import types

import pytest
import torch

from slime.algo.logprobs import chunked_log_probs_and_entropy, log_probs_and_entropy
from slime.train import batching
from slime.train.fsdp.critic import FSDPCritic
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.validation import config_problems


def _unpacked(model, batch, indices, temperature):
    """Reference: each sample alone in a [1, L] sdpa forward, full logits, unchunked."""
    log_probs, entropy = [], []
    for i in indices:
        tokens, response = batch.tokens[i], batch.response_lengths[i]
        logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0]
        prompt = len(tokens) - response
        lp, ent = log_probs_and_entropy(
            logits[prompt - 1 : len(tokens) - 1],
            torch.tensor(tokens[prompt:]),
            temperature=temperature,
            with_entropy=True,
        )
        log_probs.append(lp)
        entropy.append(ent)
    return torch.cat(log_probs), torch.cat(entropy)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_chunked_log_probs_and_entropy_equal_unchunked_with_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    bias = torch.randn(50, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    coef = torch.randn(37)

    def run(chunked: bool):
        for t in (hidden, weight, bias):
            t.grad = None
        if chunked:
            lp, ent = chunked_log_probs_and_entropy(
                hidden, weight, bias, targets, temperature=0.7, with_entropy=True, chunk_size=5
            )
        else:
            lp, ent = log_probs_and_entropy(hidden @ weight.T + bias, targets, temperature=0.7, with_entropy=True)
        ((lp * coef).sum() + (ent * coef.flip(0)).sum()).backward()
        return lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone(), bias.grad.clone()

    # float32 sums in another order (five-row matmuls against one): the gradients' terms reach ~10, so a few ulps
    # of them (1.9e-6 measured under load, when the CPU kernels block differently) is not a difference
    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    lp, ent = chunked_log_probs_and_entropy(
        hidden, weight, None, targets, temperature=1.0, with_entropy=False, chunk_size=8
    )
    assert ent is None and lp.shape == (37,)
    torch.testing.assert_close(
        lp, log_probs_and_entropy(hidden @ weight.T, targets, temperature=1.0, with_entropy=False)[0], rtol=0, atol=1e-6
    )


def test_packed_log_probs_entropy_and_gradients_equal_unpacked(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    setup = make_setup(tiny_model_dir)
    backend = make_backend(setup)
    backend.LOGITS_CHUNK_TOKENS = 4  # several chunks per micro-batch
    batch = batches_for(make_samples(6, seed=3), dp=1, k=1)[0]
    backend.load_batch(0, batch)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    backend.model.eval()
    reference.eval()
    indices = list(range(len(batch)))
    lp, ent = backend._forward(backend.model, batch, indices, with_entropy=True)
    ref_lp, ref_ent = _unpacked(reference, batch, indices, setup.temperature)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    coef = torch.linspace(-1, 1, lp.numel())
    ((lp * coef).sum() + 0.3 * ent.sum()).backward()
    ((ref_lp * coef).sum() + 0.3 * ref_ent.sum()).backward()
    packed, unpacked = _grads(backend.model), _grads(reference)
    assert packed.keys() == unpacked.keys() and len(packed) > 0
    for name, grad in packed.items():
        torch.testing.assert_close(grad, unpacked[name], rtol=0, atol=1e-5, msg=name)


def test_a_sample_never_attends_to_another(tiny_model_dir):
    backend = make_backend(make_setup(tiny_model_dir))
    samples = make_samples(5, seed=4)
    batch = batches_for(samples, dp=1, k=1)[0]
    backend.load_batch(0, batch)
    with torch.no_grad():
        before = backend._forward(backend.model, batch, list(range(5)), with_entropy=True)
        victim = 2
        batch.tokens[victim] = [(t + 7) % 70 + 4 for t in batch.tokens[victim]]  # same length, other tokens
        after = backend._forward(backend.model, batch, list(range(5)), with_entropy=True)
    starts = batching.offsets(batch.response_lengths)
    for i in range(5):
        span = slice(starts[i], starts[i + 1])
        for a, b in zip(before, after):
            assert torch.equal(a[span], b[span]) == (i != victim), i


def test_token_bins_first_fit_decreasing_deterministic():
    lengths = [5, 9, 3, 12, 4, 6, 2]
    bins = batching.token_bins(list(range(7)), lengths, max_tokens=10)
    assert bins == [[0, 2, 6], [1], [3], [4, 5]]  # 12 > 10 sits alone; every sample exactly once
    assert batching.token_bins(list(range(7)), lengths, max_tokens=10) == bins
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins if len(b) > 1)
    assert batching.split([0, 1, 2], lengths, micro_batch_size=2, max_tokens=None) == [[0, 1], [2]]
    assert batching.split([0, 1, 2], lengths, micro_batch_size=2, max_tokens=100) == [[0, 1, 2]]
    assert batching.pad_to([[0], [1]], 4) == [[0], [1], [], []]


def test_the_fullest_micro_batch_counts_each_optimizer_steps_split_alone():
    """`perf/micro_batch_tokens`: samples of different optimizer steps never share a micro-batch; by samples the
    fullest chunk, by tokens the fullest bin (a sample over the limit alone)."""
    lengths = [5, 9, 3, 12, 4, 6, 2]
    batch = types.SimpleNamespace(tokens=[[0] * n for n in lengths], step_ids=[0, 0, 0, 0, 1, 1, 1])
    assert batching.largest_micro_batch(batch, micro_batch_size=2, max_tokens=None) == 15  # [3, 12] of step 0
    assert batching.largest_micro_batch(batch, micro_batch_size=4, max_tokens=None) == 29  # step 0 whole
    assert batching.largest_micro_batch(batch, micro_batch_size=8, max_tokens=10) == 12  # 12 alone; [6, 4] 10
    assert batching.largest_micro_batch(batch, micro_batch_size=8, max_tokens=100) == 29


@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batching_by_tokens_equals_by_samples(tiny_model_dir, per_token):
    common = [
        "algo.use_kl_loss=true",
        "algo.kl_loss_coef=0.1",
        f"checkpoint.ref_load={tiny_model_dir}",
        f"algo.calculate_per_token_loss={per_token}",
        # Adam's first update is ±lr wherever |g| >> eps: a gradient near 0 flips on fp32 summation
        # order; a larger eps keeps such elements' updates proportional to their (tiny) gradients
        "train.adam_eps=1e-6",
    ]
    samples = make_samples(12, seed=5)
    results = []
    for extra in (["parallelism.micro_batch_size=3"], ["parallelism.max_tokens_per_gpu=20"]):
        setup = make_setup(tiny_model_dir, common + extra)
        backend = make_backend(setup)
        steps = train_rollout(backend, batches_for(samples, dp=1, k=2)[0])["steps"]
        results.append((steps, {n: p.detach().clone() for n, p in backend.model.named_parameters()}, setup))
    (by_samples, params_a, setup), (by_tokens, params_b, _) = results
    assert by_tokens[0]["train/ppo_kl"] == 0.0 and by_tokens[0]["train/kl_loss"] == 0.0
    for s1, s2 in zip(by_samples, by_tokens):
        for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy_loss", "train/grad_norm"):
            assert s1[key] == pytest.approx(s2[key], rel=1e-5, abs=1e-5), key
    for name, p in params_a.items():
        torch.testing.assert_close(p, params_b[name], rtol=1e-4, atol=0.01 * setup.train.lr)


def test_critic_packed_values_equal_unpacked_and_train(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForTokenClassification

    setup = make_setup(tiny_model_dir, ["parallelism.max_tokens_per_gpu=16"])
    critic = make_backend(setup, cls=FSDPCritic)
    with torch.no_grad():
        critic.model.score.weight.normal_()  # non-zero values
    batch = batches_for(make_samples(6, seed=6), dp=1, k=1)[0]
    critic.load_batch(0, batch)
    values = critic.compute_values()
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1, classifier_dropout=0.0)
    reference = AutoModelForTokenClassification.from_pretrained(
        tiny_model_dir, config=config, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    reference.load_state_dict(critic.model.state_dict())
    with torch.no_grad():
        for i, got in enumerate(values):
            tokens, response = batch.tokens[i], batch.response_lengths[i]
            out = reference(input_ids=torch.tensor([tokens])).logits[0, len(tokens) - response - 1 : len(tokens) - 1, 0]
            torch.testing.assert_close(torch.tensor(got), out, rtol=0, atol=1e-5)
    critic.set_column("returns", [[1.0] * len(v) for v in values])
    steps = critic.train()["steps"]
    assert steps[0]["train/value_loss"] > 0 and steps[0]["train/critic-grad_norm"] > 0


def test_validation_of_max_tokens_and_ref_offload():
    found = config_problems(["parallelism.max_tokens_per_gpu=0", "train.ref_offload=true"])
    assert "parallelism.max_tokens_per_gpu" in found["parallelism.max_tokens_per_gpu"]
    assert "set train.ref_offload=false" in found["train.ref_offload"]


def test_ref_offload_on_cpu_is_a_no_op(tiny_model_dir):
    """On CPU runs the reference model never leaves the CPU: the step equals one without ref_offload."""
    common = ["algo.use_kl_loss=true", "algo.kl_loss_coef=0.1", f"checkpoint.ref_load={tiny_model_dir}"]
    batch = batches_for(make_samples(4, seed=7), dp=1, k=1)[0]
    runs = []
    for offload in (False, True):
        backend = make_backend(make_setup(tiny_model_dir, common + [f"train.ref_offload={offload}"]))
        runs.append(train_rollout(backend, batch)["steps"][0])
        assert all(p.device.type == "cpu" for p in backend.frozen["ref"].parameters())
    assert runs[1]["train/kl_loss"] == runs[0]["train/kl_loss"] == 0.0
    assert runs[1]["train/loss"] == runs[0]["train/loss"]
