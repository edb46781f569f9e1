"""Batch-invariant decoding (`--enable-deterministic-inference`, what rollout.deterministic runs on the CPU): a request
gets the same tokens and the same log-prob bits alone as inside batches of 2, 7 and 32 other requests, whatever their
order, prompt lengths and sampling parameters, joining a running batch or not; the trainer scores those tokens as the
engine did."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
import torch.nn.functional as F

from slime.engine.hf import batch_invariant
from slime.engine.hf.generator import GenerationRequest, Generator
from slime.engine.hf.sampling import LogitsSampler, SamplingParams
from slime.engine.hf.scheduler import Scheduler

VOCAB = 80  # tiny_qwen3's


def _request(i: int, *, seeded: bool = True) -> GenerationRequest:
    """Request i of a varied set: prompts of 1-30 tokens, greedy and sampled rows, top-k / top-p, penalties, stops."""
    rng = random.Random(i)
    params = {
        "max_new_tokens": rng.randrange(1, 14),
        "temperature": rng.choice([0.0, 0.7, 1.0, 1.3]),
        "ignore_eos": rng.random() < 0.7,
    }
    if seeded:
        params["sampling_seed"] = rng.randrange(1 << 30)
    if rng.random() < 0.3:
        params["top_k"] = rng.randrange(1, 20)
    if rng.random() < 0.3:
        params["top_p"] = rng.uniform(0.3, 1.0)
    if rng.random() < 0.2:
        params["repetition_penalty"] = 1.2
    prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 31))]
    return GenerationRequest(prompt, SamplingParams.from_dict(params), rid=str(i))


TARGET = GenerationRequest(
    [1, 5, 11, 16, 28, 23, 29, 62],
    SamplingParams.from_dict({"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 1234, "ignore_eos": True}),
)


def _outputs(result) -> tuple:
    return result.output_ids, result.output_logprobs, result.finish_reason


@pytest.fixture
def invariant(tiny_model) -> Generator:
    model, tok = tiny_model
    return Generator(model, tok, prefix_cache_tokens=0, batch_invariant=True)


def test_linear_rows_are_the_rows_of_a_lone_call():
    """Each row of `batch_invariant.linear` over 1-200 rows is, bit for bit, that row's output computed alone."""
    torch.manual_seed(0)
    weight, bias = torch.randn(192, 64), torch.randn(192)
    x = torch.randn(200, 64)
    alone = torch.cat([batch_invariant.linear(x[i : i + 1], weight, bias) for i in range(200)])
    for rows in (1, 2, 3, 5, 63, 64, 65, 200):
        assert torch.equal(batch_invariant.linear(x[:rows], weight, bias), alone[:rows])
    torch.testing.assert_close(alone, F.linear(x, weight, bias))  # the same function, up to rounding


def test_elementwise_functions_take_one_form_whatever_the_batch():
    """silu of a 100-wide row alone (its last 4 elements in aten's scalar tail) and inside 1-40 rows: plain F.silu
    gives some row other bits in a batch; `batch_invariant.aligned` gives every row its lone bits."""
    torch.manual_seed(0)
    x = torch.randn(40, 100) * 4
    alone = torch.cat([batch_invariant.aligned(F.silu, x[i : i + 1]) for i in range(40)])
    plain = torch.cat([F.silu(x[i : i + 1]) for i in range(40)])
    assert all(torch.equal(batch_invariant.aligned(F.silu, x[:rows]), alone[:rows]) for rows in range(1, 41))
    assert not all(torch.equal(F.silu(x[:rows]), plain[:rows]) for rows in range(1, 41))


def test_attention_of_a_padded_row_is_its_lone_attention():
    """A row's attention inside a left-padded batch, prefill and decode, is its attention computed alone."""
    torch.manual_seed(0)
    lengths = [3, 9, 1, 9, 6]
    width = max(lengths)
    mask = torch.tensor([[False] * (width - n) + [True] * n for n in lengths])
    for q_len in (width, 1):
        query, key, value = torch.randn(5, 4, q_len, 16), torch.randn(5, 2, width, 16), torch.randn(5, 2, width, 16)
        out, _ = batch_invariant.attention(None, query, key, value, mask, scaling=0.25)
        for row, n in enumerate(lengths):
            fed = min(q_len, n)
            alone, _ = batch_invariant.attention(
                None, query[row : row + 1, :, q_len - fed :], key[row : row + 1, :, -n:], value[row : row + 1, :, -n:],
                None, scaling=0.25,
            )  # fmt: skip
            assert torch.equal(out[row, q_len - fed :], alone[0])
    with pytest.raises(ValueError, match="left-padded"):
        batch_invariant.attention(None, query, key, value, mask.flip(-1), scaling=0.25)


@pytest.mark.parametrize("size", [2, 7, 32])
def test_a_request_decodes_alike_alone_and_in_a_batch(invariant, size):
    """The target request alone, then first, in the middle and last of a batch of `size` varied requests, and in the
    reversed batch (another arrival order): the same tokens and log-prob bits, and so are every other row's."""
    others = [_request(i) for i in range(size - 1)]
    alone = {r.rid: _outputs(invariant.generate([r])[0]) for r in [*others, TARGET]}
    for position in sorted({0, size // 2, size - 1}):
        batch = others[:position] + [TARGET] + others[position:]
        for order in (batch, batch[::-1]):
            got = invariant.generate(order)
            assert {r.rid: _outputs(res) for r, res in zip(order, got)} == alone


def test_without_the_mode_a_batch_changes_log_probs(tiny_model):
    """The control: the same batch without batch-invariant ops gives log-probs of other bits than alone (float32
    rounding of another reduction order), which is what the mode removes."""
    model, tok = tiny_model
    plain = Generator(model, tok, prefix_cache_tokens=0)
    batch = [_request(i) for i in range(31)] + [TARGET]
    alone = [plain.generate([r])[0].output_logprobs for r in batch]
    assert [r.output_logprobs for r in plain.generate(batch)] != alone


def test_rows_joining_a_running_batch_keep_their_lone_outputs(invariant):
    """Continuous batching: requests join the running rows between decode steps (caches of other lengths merged,
    left-padded), in two arrival orders; every request gets its lone outputs."""
    requests = [_request(i) for i in range(24)] + [TARGET]
    alone = {r.rid: _outputs(invariant.generate([r])[0]) for r in requests}
    for order in (requests, requests[::-1]):
        batch, got, pending = invariant.new_batch(), {}, list(order)
        while pending or batch:
            joining, pending = pending[:3], pending[3:]
            got.update((key, _outputs(res)) for key, res in batch.add(joining, [r.rid for r in joining]))
            if batch:
                got.update((key, _outputs(res)) for key, res in batch.step())
        assert got == alone


def test_the_scheduler_serves_concurrent_requests_their_lone_outputs(tiny_model):
    """The engine's scheduler (continuous batching, up to 32 rows) under concurrent submissions in two arrival
    orders, each request submitted on its own: the outputs of a one-request-at-a-time scheduler."""
    model, tok = tiny_model
    requests = [_request(i) for i in range(40)] + [TARGET]

    async def serve(order: list[GenerationRequest], max_batch_size: int) -> dict:
        generator = Generator(model, tok, batch_invariant=True)
        scheduler = Scheduler(generator, max_batch_size=max_batch_size, batch_wait_s=0.002, weight_version="0")
        scheduler.start()

        async def one(i: int, req: GenerationRequest):
            await asyncio.sleep(0.001 * (i % 7))  # arrivals spread over the first decode steps
            return req.rid, _outputs((await scheduler.submit([req]))[0].result)

        try:
            return dict(await asyncio.gather(*(one(i, r) for i, r in enumerate(order))))
        finally:
            await scheduler.stop()

    alone = asyncio.run(serve(requests, 1))
    assert asyncio.run(serve(requests, 32)) == alone
    assert asyncio.run(serve(requests[::-1], 32)) == alone


def test_unseeded_rows_get_a_seed_of_their_own(invariant, tiny_model):
    """Sampled requests without `sampling_seed` draw from their own generator seeded with SGLang's default (42):
    alone or batched, in either order, the same tokens."""
    requests = [_request(i, seeded=False) for i in range(12)]
    alone = [_outputs(invariant.generate([r])[0]) for r in requests]
    assert [_outputs(r) for r in invariant.generate(requests)] == alone
    assert [_outputs(r) for r in invariant.generate(requests[::-1])] == alone[::-1]


def test_a_moe_model_decodes_alike_alone_and_batched(tiny_model, tmp_path):
    """tiny_qwen3_moe: router, top-k experts and their per-expert Linears are batch-invariant too."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.moe_rollout import tiny_moe

    _, tok = tiny_model
    moe = AutoModelForCausalLM.from_pretrained(tiny_moe(tmp_path).hf_checkpoint, dtype=torch.float32).eval()
    generator = Generator(moe, tok, prefix_cache_tokens=0, batch_invariant=True)
    batch = [_request(i) for i in range(6)] + [TARGET]
    alone = [_outputs(generator.generate([r])[0]) for r in batch]
    assert [_outputs(r) for r in generator.generate(batch[::-1])] == alone[::-1]


def test_a_row_draws_alike_beside_rows_that_truncate():
    """Sampling decides truncation per row: a row without top-k / top-p sampled beside rows with them draws, from its
    own seed, the token it draws alone (a batch-wide sort would hand its uniform draw another token)."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    params = [
        SamplingParams.from_dict({"temperature": 1.0, "sampling_seed": 7}),
        SamplingParams.from_dict({"temperature": 1.0, "sampling_seed": 8, "top_k": 5}),
        SamplingParams.from_dict({"temperature": 1.0, "sampling_seed": 9, "top_p": 0.5}),
    ]

    def sample(rows: list[int]) -> list[int]:
        sampler = LogitsSampler(
            [params[i] for i in rows],
            [[1]] * len(rows),
            vocab_size=VOCAB,
            device=torch.device("cpu"),
            stop_ids_per_row=[[]] * len(rows),
            generator=torch.Generator(),
        )
        return [sampler.step(logits[rows])[0].tolist() for _ in range(20)]

    together = sample([0, 1, 2])
    for i in range(3):
        assert [step[i] for step in together] == [step[0] for step in sample([i])]


def test_the_trainer_scores_batched_tokens_as_the_engine_did(tiny_model_dir, invariant):
    """The fsdp backend's log-probs (transformers model, float32) of the tokens the batch-invariant engine sampled
    in a batch of 32 match the engine's within 1e-5 (measured: 1.4e-6 at most)."""
    from tests.helpers.fsdp_rank import make_backend, make_setup, response_log_probs

    requests = [_request(i) for i in range(31)] + [TARGET]
    for r in requests:  # log-probs of the plain softmax, what the trainer computes: T = 1, no penalty
        r.params.temperature, r.params.repetition_penalty = 1.0, 1.0
    results = invariant.generate(requests)
    backend = make_backend(make_setup(tiny_model_dir))
    try:
        diffs = [
            (response_log_probs(backend, r.input_ids, res.output_ids) - torch.tensor(res.output_logprobs)).abs().max()
            for r, res in zip(requests, results)
        ]
    finally:
        backend.shutdown()
    assert max(diffs) < 1e-5, max(diffs)


def test_a_deterministic_run_starts_its_engines_batch_invariant(tiny_model, caplog):
    """rollout.deterministic reaches the server as SGLang's flag; a server that cannot run batch-invariant there
    (two torch threads, a sliding-window layer) decodes each request alone and says so."""
    import argparse
    import copy

    from transformers import AutoModelForCausalLM

    from slime.engine.base import EngineLaunch
    from slime.engine.hf.engine import HFEngine
    from slime.engine.hf.server import decoding_mode, parse_args
    from tests.helpers.compose import typed_config

    launch = EngineLaunch(rank=0, model_path="m", host="127.0.0.1", seed=1, device="cpu", log_dir="/tmp")
    for deterministic in (True, False):
        rollout = typed_config([f"rollout.deterministic={deterministic}"]).rollout
        command = HFEngine(launch, HFEngine.config_from(rollout)).command([15000])
        assert ("--enable-deterministic-inference" in command) is deterministic
    args = parse_args(["--model-path", "m", "--port", "0", "--enable-deterministic-inference"])
    model, _ = tiny_model
    assert decoding_mode(args, model) == (True, 256)
    assert decoding_mode(argparse.Namespace(**{**vars(args), "max_batch_size": 1}), model) == (False, 1)
    torch.set_num_threads(2)
    try:
        assert decoding_mode(args, model) == (False, 1)
    finally:
        torch.set_num_threads(1)
    sliding = copy.deepcopy(model.config)
    sliding.layer_types, sliding.sliding_window, sliding.use_sliding_window = (
        ["full_attention", "sliding_attention"],
        4,
        True,
    )
    windowed = AutoModelForCausalLM.from_config(sliding)
    assert "full-attention layers only" in batch_invariant.unsupported(windowed)
    assert decoding_mode(args, windowed) == (False, 1)
    assert caplog.text.count("deterministic inference decodes each request alone") == 2


def test_the_server_answers_concurrent_requests_as_it_answers_them_one_by_one(tiny_model_dir, tmp_path):
    """A real hf engine process with --enable-deterministic-inference and batches of up to 32: 33 requests sent at
    once, in two orders, get exactly the tokens and log-probs each gets when sent alone."""
    from concurrent.futures import ThreadPoolExecutor

    from slime.engine import http_client
    from tests.helpers.engines import start_engine

    bodies = [
        {"input_ids": r.input_ids, "sampling_params": _wire_params(r.params), "return_logprob": True}
        for r in [*(_request(i) for i in range(32)), TARGET]
    ]
    engine = start_engine(tiny_model_dir, tmp_path, deterministic=True, max_batch_size=32)
    try:

        def send(body: dict) -> tuple:
            out = http_client.post(engine.url + "/generate", body)
            return out["output_ids"], out["meta_info"]["output_token_logprobs"]

        alone = [send(b) for b in bodies]
        with ThreadPoolExecutor(len(bodies)) as pool:
            assert list(pool.map(send, bodies)) == alone
            assert list(pool.map(send, bodies[::-1])) == alone[::-1]
        info = http_client.get(engine.url + "/server_info")
        assert info["batch_invariant"] is True and info["max_batch_size"] == 32
    finally:
        engine.shutdown()


def _wire_params(params: SamplingParams) -> dict:
    keys = ("max_new_tokens", "temperature", "sampling_seed", "ignore_eos", "top_k", "top_p", "repetition_penalty")
    return {k: getattr(params, k) for k in keys}
