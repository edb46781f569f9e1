"""Continuous batching in the hf engine: requests join a running batch between decode steps (`batch.RunningBatch`,
`scheduler.Scheduler`), with the tokens they get alone (greedy) and log-probs within LOGPROB_ATOL of them; aborts,
pauses and exclusive operations keep their contracts; one-request batches never join."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from slime.engine.hf.generator import GenerationRequest, Generator
from slime.engine.hf.sampling import LogitsSampler, SamplingParams
from slime.engine.hf.scheduler import Scheduler
from tests.helpers.moe_rollout import tiny_moe

# Left padding and a different batch change float32 summation order: measured at most 9.5e-7 here (tiny_qwen3).
LOGPROB_ATOL = 1e-5
LONG_PROMPT = [1, 5, 11, 16, 28, 23, 29]
JOINERS = [[4, 9], [1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44], [7, 3, 2, 8, 9, 12]]


def _req(prompt, rid="", **params) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams.from_dict({"temperature": 0, **params}), rid)


def _long(**params) -> GenerationRequest:
    return _req(LONG_PROMPT, "long", max_new_tokens=40, ignore_eos=True, **params)


def _assert_same(got, alone) -> None:
    assert got.output_ids == alone.output_ids and got.finish_reason == alone.finish_reason
    torch.testing.assert_close(
        torch.tensor(got.output_logprobs), torch.tensor(alone.output_logprobs), atol=LOGPROB_ATOL, rtol=0
    )


@pytest.fixture
def gen(tiny_model) -> Generator:
    model, tok = tiny_model
    return Generator(model, tok, prefix_cache_tokens=0)


@pytest.mark.parametrize("joined_after", [1, 3, 12])
def test_rows_joining_a_running_batch_get_their_lone_outputs(gen, joined_after):
    """Prompts shorter and longer than the running rows' cache join after `joined_after` steps (both sides of the
    merge are left-padded); with penalties, min_new_tokens and stop tokens among them; every row's output is its
    lone output, the running row's too."""
    joiners = [
        _req(JOINERS[0], max_new_tokens=8, ignore_eos=True),
        _req(JOINERS[1], max_new_tokens=6, presence_penalty=1.5, repetition_penalty=1.2),
        _req(JOINERS[2], max_new_tokens=9, min_new_tokens=4, stop_token_ids=[17, 40]),
    ]
    alone = [gen.generate([r])[0] for r in [_long(), *joiners]]
    batch, results = gen.new_batch(), {}
    results.update(batch.add([_long()], [0]))
    for _ in range(joined_after):
        results.update(batch.step())
    results.update(batch.add(joiners, [1, 2, 3]))
    assert len(batch) == 4
    while batch:
        results.update(batch.step())
    for key, lone in enumerate(alone):
        _assert_same(results[key], lone)


def test_sampler_extend_keeps_each_rows_state():
    """A sampler with penalties appended to one without: the old rows' logits pass unchanged, per-row counts
    (min_new_tokens) continue."""
    kwargs = {"vocab_size": 8, "device": torch.device("cpu"), "generator": torch.Generator()}
    plain = LogitsSampler([SamplingParams(temperature=0)], [[1]], stop_ids_per_row=[[0]], **kwargs)
    plain.step(torch.randn(1, 8))
    penal = SamplingParams(temperature=0, presence_penalty=2.0, min_new_tokens=1)
    plain.extend(LogitsSampler([penal], [[2]], stop_ids_per_row=[[3]], **kwargs))
    assert plain.generated == [1, 0] and plain.use_penalties
    logits = torch.tensor([[0.0, 5, 1, 2, 0, 0, 0, 0], [0.0, 0, 0, 9, 0, 0, 0, 8]])
    tokens, _ = plain.step(logits)
    assert tokens.tolist() == [1, 7]  # row 1: stop token 3 masked (min_new_tokens)
    tokens, _ = plain.step(logits)
    assert tokens.tolist() == [1, 3]  # presence penalty on 7 now; 3 allowed


def _serve(tiny_model, body, max_batch_size=8, **kwargs):
    """Run `body(scheduler)` on a started scheduler over a fresh generator (its own event loop)."""

    async def main():
        model, tok = tiny_model
        sched = Scheduler(
            Generator(model, tok, prefix_cache_tokens=0),
            max_batch_size=max_batch_size,
            batch_wait_s=0.0,
            weight_version="0",
            **kwargs,
        )
        sched.start()
        try:
            return await body(sched)
        finally:
            await sched.stop()

    return asyncio.run(main())


async def _until(predicate, timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.0005)


async def _start_long(sched, **params) -> asyncio.Task:
    """The long request, returned once it has sampled a token (so it is mid-decode)."""
    task = asyncio.ensure_future(sched.submit([_long(**params)]))
    await _until(lambda: sched.generator.num_generated_tokens > 0)
    return task


def test_short_request_submitted_mid_batch_returns_first(tiny_model, gen):
    short = lambda: _req(JOINERS[2], "short", max_new_tokens=4)  # noqa: E731
    alone_short, alone_long = gen.generate([short()])[0], gen.generate([_long()])[0]

    async def body(sched):
        long_task = await _start_long(sched)
        (done,) = await sched.submit([short()])
        assert not long_task.done() and sched.loads()["num_running_reqs"] == 1
        (long_done,) = await long_task
        return done, long_done

    done, long_done = _serve(tiny_model, body)
    _assert_same(done.result, alone_short)
    _assert_same(long_done.result, alone_long)
    assert done.weight_version == long_done.weight_version == "0"


def test_abort_of_a_joined_row(tiny_model):
    async def body(sched):
        long_task = await _start_long(sched)
        joined = asyncio.ensure_future(sched.submit([_req(JOINERS[0], "joined", max_new_tokens=30, ignore_eos=True)]))
        await _until(lambda: sched.loads()["num_running_reqs"] == 2)
        before = sched.generator.num_generated_tokens
        await _until(lambda: sched.generator.num_generated_tokens >= before + 2)  # the joined row has sampled
        assert sched.abort(rid="joined") == 1
        (aborted,) = await joined
        assert not long_task.done()
        (finished,) = await long_task
        return aborted.result, finished.result

    aborted, finished = _serve(tiny_model, body)
    assert aborted.finish_reason == {"type": "abort", "message": "Aborted by request"}
    assert 0 < len(aborted.output_ids) < 30 and len(aborted.output_logprobs) == len(aborted.output_ids)
    assert finished.finish_reason == {"type": "length", "length": 40}


def test_pause_abort_cuts_every_running_row_and_holds_new_ones(tiny_model):
    async def body(sched):
        long_task = await _start_long(sched)
        joined = asyncio.ensure_future(sched.submit([_req(JOINERS[1], max_new_tokens=30, ignore_eos=True)]))
        await _until(lambda: sched.loads()["num_running_reqs"] == 2)
        before = sched.generator.num_generated_tokens
        await _until(lambda: sched.generator.num_generated_tokens >= before + 2)  # the joined row has sampled
        await sched.pause("abort")
        cut = [c.result for (c,) in await asyncio.gather(long_task, joined)]
        held = asyncio.ensure_future(sched.submit([_req(JOINERS[0], max_new_tokens=3)]))
        await asyncio.sleep(0.05)
        assert not held.done() and sched.loads() == {"num_running_reqs": 0, "num_waiting_reqs": 1, "num_total_reqs": 1}
        sched.resume()
        (after,) = await held
        return cut, after.result

    cut, after = _serve(tiny_model, body)
    for result in cut:
        assert result.finish_reason["type"] == "abort" and 0 < len(result.output_ids) < 30
    assert len(after.output_ids) == 3


def test_pause_retract_lets_running_rows_finish_and_nothing_join(tiny_model):
    async def body(sched):
        long_task = await _start_long(sched)
        await sched.pause("retract")
        queued = asyncio.ensure_future(sched.submit([_req(JOINERS[0], max_new_tokens=3)]))
        (finished,) = await long_task
        await asyncio.sleep(0.05)
        assert not queued.done() and sched.loads()["num_waiting_reqs"] == 1
        sched.resume()
        (after,) = await queued
        return finished.result, after.result

    finished, after = _serve(tiny_model, body)
    assert finished.finish_reason == {"type": "length", "length": 40} and len(after.output_ids) == 3


def test_pause_in_place_holds_running_rows_across_a_weight_update(tiny_model, gen):
    """SGLang's in_place pause: the running rows stop between two decode steps, an exclusive operation (a new weight
    version here) runs while they are held, and they decode on after resume with their cache: the same tokens as
    alone, the versions that sampled them in SGLang's spans; a request sent meanwhile waits, nothing joins."""
    alone = gen.generate([_long()])[0]

    async def body(sched):
        long_task = await _start_long(sched)
        await sched.pause("in_place")
        queued = asyncio.ensure_future(sched.submit([_req(JOINERS[0], max_new_tokens=3)]))
        seen = {}

        def update():
            seen.update(busy=sched.is_busy, tokens=sched.generator.num_generated_tokens)
            sched.weight_version = "1"

        await asyncio.wait_for(sched.run_exclusive(update), 30)
        await asyncio.sleep(0.05)
        seen.update(held=sched.generator.num_generated_tokens == seen["tokens"], queued_done=queued.done())
        sched.resume()
        (done,) = await long_task
        (after,) = await queued
        return seen, done, after

    seen, done, after = _serve(tiny_model, body)
    assert seen["busy"] is True and seen["held"] is True and seen["queued_done"] is False
    _assert_same(done.result, alone)
    first = seen["tokens"]  # one row decoding: one token per step
    assert 0 < first < 40 and done.weight_version == "1"
    assert done.weight_versions == [
        {"version": "0", "start": 0, "end": first},
        {"version": "1", "start": first, "end": 40},
    ]
    assert after.weight_versions == [{"version": "1", "start": 0, "end": 3}]


def test_exclusive_operation_gets_the_model_while_requests_keep_arriving(tiny_model):
    """New requests arrive every few ms (each would join and keep the batch alive); an exclusive operation asked
    for mid-batch stops the joining and runs once the running rows end, the requests that came meanwhile held."""

    async def body(sched):
        long_task = await _start_long(sched)
        stop, arrivals = asyncio.Event(), []

        async def feed():
            while not stop.is_set():
                arrivals.append(asyncio.ensure_future(sched.submit([_req(JOINERS[0], max_new_tokens=20)])))
                await asyncio.sleep(0.002)

        feeder = asyncio.ensure_future(feed())
        await _until(lambda: sched.loads()["num_running_reqs"] > 2)
        seen = {"asked": len(arrivals)}

        def exclusive():
            seen.update(busy=sched.is_busy, long_done=long_task.done(), arrived=len(arrivals), **sched.loads())

        await asyncio.wait_for(sched.run_exclusive(exclusive), 60)
        stop.set()
        await feeder
        await asyncio.gather(long_task, *arrivals)
        return seen

    seen = _serve(tiny_model, body)
    assert seen["busy"] is False and seen["long_done"] is True and seen["num_running_reqs"] == 0
    assert seen["arrived"] > seen["asked"] and seen["num_waiting_reqs"] > 0  # held, not joined


def test_static_batches_where_joining_is_unsafe(tiny_model, tmp_path):
    """Batch size 1, MoE route capture and `continuous=False` keep one `generate` call per
    batch: a request submitted mid-batch waits for the whole batch."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny_model
    moe = AutoModelForCausalLM.from_pretrained(tiny_moe(tmp_path).hf_checkpoint, dtype=torch.float32).eval()
    assert Generator(moe, tok).joinable and not Generator(moe, tok, capture_routes=True).joinable
    for size in (1, 8):
        assert Scheduler(Generator(model, tok), max_batch_size=size, batch_wait_s=0, weight_version="").continuous == (
            size > 1
        )

    async def body(sched):
        long_task = await _start_long(sched)
        await sched.submit([_req(JOINERS[0], max_new_tokens=2)])
        return long_task.done()

    assert _serve(tiny_model, body, max_batch_size=1) is True
    assert _serve(tiny_model, body, continuous=False) is True
