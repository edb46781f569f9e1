"""The static-cache decode path (`static_cache.SlotDecoder`, `static_batch.StaticBatch`), run eagerly on CPU: the
tokens, finish reasons and log-probs of the dynamic path, with rows finishing at different lengths, rows joining a
running batch into freed slots, the cache growing, the prefix cache and the fallbacks."""

from __future__ import annotations

import pytest
import torch

from slime.engine.hf.batch import RunningBatch
from slime.engine.hf.generator import Generator
from slime.engine.hf.static_batch import StaticBatch
from slime.engine.hf.static_cache import SlotDecoder, bucket, mask_form, unsupported, width
from tests.helpers.static_decode import assert_same_results, request, run_schedule

# A different padding width and batch change float32 summation order (as in test_continuous_batching.py).
LOGPROB_ATOL = 1e-5
PROMPTS = [[1, 5, 11], [1, 5, 11, 16, 28, 23, 29, 62, 2, 1, 7], [4, 9], [1, 30, 31, 32, 33, 34]]


def generators(tiny_model, **kwargs) -> tuple[Generator, Generator]:
    """(dynamic-cache generator, static-cache generator) on the tiny model, the same seed and options."""
    model, tok = tiny_model
    return Generator(model, tok, seed=3, **kwargs), Generator(model, tok, seed=3, static_decode=True, **kwargs)


def mixed_requests(**params) -> list:
    """PROMPTS with different budgets and stops: rows finish at different steps."""
    return [
        request(PROMPTS[0], max_new_tokens=5, ignore_eos=True, **params),
        request(PROMPTS[1], max_new_tokens=17, ignore_eos=True, **params),
        request(PROMPTS[2], max_new_tokens=11, min_new_tokens=3, stop_token_ids=[17, 40, 9], **params),
        request(PROMPTS[3], max_new_tokens=9, repetition_penalty=1.3, ignore_eos=True, **params),
    ]


def test_buckets_and_widths():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 14, 16, 17)] == [1, 2, 4, 4, 8, 16, 16, 32]
    assert [width(n) for n in (1, 256, 257, 524, 1025)] == [256, 256, 512, 1024, 2048]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_k": 20, "sampling_seed": 11}])
def test_static_path_gives_the_dynamic_paths_outputs(tiny_model, sampling):
    """Greedy and seeded sampling: same tokens, finish reasons and log-probs; the rows' lengths differ."""
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)
    want = run_schedule(dynamic, {0: mixed_requests(**sampling)})
    got = run_schedule(static, {0: mixed_requests(**sampling)})
    assert_same_results(got, want, LOGPROB_ATOL)
    assert len({len(r.output_ids) for r in got.values()}) >= 3
    assert static.slots.capacity == 4 and static.slots.length == 256 and not static.slots.taken


def test_shared_generator_rows_draw_as_on_the_dynamic_path(tiny_model):
    """Rows without a seed draw from the generator's shared stream in the same order on both paths."""
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)
    reqs = lambda: [request(p, temperature=1.0, max_new_tokens=12, ignore_eos=True) for p in PROMPTS]  # noqa: E731
    want, got = dynamic.generate(reqs()), static.generate(reqs())
    for a, b in zip(got, want):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(
            torch.tensor(a.output_logprobs), torch.tensor(b.output_logprobs), atol=LOGPROB_ATOL, rtol=0
        )


@pytest.mark.parametrize("joined_after", [1, 4, 9])
def test_rows_joining_take_freed_slots_with_the_dynamic_paths_outputs(tiny_model, joined_after):
    """Rows join after some rows left (their slots are reused) and while others run, prompts longer and shorter
    than the running rows'."""
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)

    def schedule():
        joiners = [request(PROMPTS[1], max_new_tokens=6, presence_penalty=1.5), request([3, 8], max_new_tokens=7)]
        late = [request([9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], max_new_tokens=5, ignore_eos=True)]
        return {0: mixed_requests(), joined_after: joiners, joined_after + 6: late}

    want = run_schedule(dynamic, schedule())
    batch = static.new_batch()
    assert isinstance(batch, StaticBatch)
    got = run_schedule(static, schedule())
    assert_same_results(got, want, LOGPROB_ATOL)
    assert static.slots.capacity <= 8 and not static.slots.taken  # freed slots were reused, all free at the end


@pytest.fixture(scope="module")
def tiny_llama(tiny_model):
    """(a 2-layer random Llama on the tiny model's vocabulary, its tokenizer): a forward that builds its mask with
    `create_causal_mask`, which takes the step's 4-D mask as it is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tok = tiny_model
    config = LlamaConfig(
        vocab_size=model.config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=model.config.eos_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), tok


def test_a_llama_decodes_on_slots_with_the_dynamic_paths_outputs(tiny_llama):
    """Llama's forward takes a prepared 4-D mask: the static path applies and gives the dynamic path's outputs, a
    row joining included."""
    model, _ = tiny_llama
    assert (
        mask_form(model) == "4d"
        and unsupported(model, capture_routes=False, batch_invariant=False, vision=None) is None
    )
    dynamic, static = generators(tiny_llama, prefix_cache_tokens=0)
    schedule = lambda: {0: mixed_requests(), 3: [request([3, 8, 21], max_new_tokens=7, ignore_eos=True)]}  # noqa: E731
    want = run_schedule(dynamic, schedule())
    got = run_schedule(static, schedule())
    assert_same_results(got, want, LOGPROB_ATOL)
    assert len({len(r.output_ids) for r in got.values()}) >= 3 and not static.slots.taken


class UncapturableGraphs:
    """Graphs whose capture fails as CUDA's does for a step it cannot record."""

    def run(self, key, step):
        raise RuntimeError("operation not permitted when stream is capturing")

    def clear(self) -> None:
        pass


def test_a_step_that_cannot_be_captured_decodes_without_graphs(tiny_model, caplog):
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)
    static.slots.graphs = UncapturableGraphs()
    want = run_schedule(dynamic, {0: mixed_requests()})
    got = run_schedule(static, {0: mixed_requests()})
    assert_same_results(got, want, LOGPROB_ATOL)
    assert static.slots.graphs is None
    assert "could not be captured as a CUDA graph (operation not permitted" in caplog.text


def test_joiners_fill_the_lowest_free_slots(tiny_model):
    _, static = generators(tiny_model, prefix_cache_tokens=0)
    batch = static.new_batch()
    batch.add([request(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(PROMPTS, (5, 17, 11, 9))], range(4))
    for _ in range(6):  # row 0 (5 tokens) finishes at step 5
        batch.step()
    assert batch.slots == [1, 2, 3] and static.slots.host_lengths[0] == 0
    batch.add([request([4, 9], max_new_tokens=3), request([5], max_new_tokens=3)], [4, 5])
    assert batch.slots == [1, 2, 3, 0, 4] and static.slots.capacity == 8
    assert static.slots.host_lengths[:5] == [2, 11 + 6, 2 + 6, 6 + 6, 1]
    assert static.slots.lengths.tolist()[:5] == static.slots.host_lengths[:5]


def test_load_copies_left_padded_rows_to_the_first_columns(tiny_model):
    """A left-padded prefill's rows land at columns 0..n-1 of their slots, their lengths n."""
    _, static = generators(tiny_model, prefix_cache_tokens=0)
    decoder = static.slots
    batch = static.new_batch()
    batch.add([request(PROMPTS[0]), request(PROMPTS[1])], [0, 1])
    cache, mask = batch.cache, batch.mask
    assert decoder.acquire(batch)
    slots = decoder.load(cache, mask, bound=64)
    assert slots == [0, 1] and decoder.host_lengths[:2] == [3, 11] and decoder.lengths.tolist() == [3, 11]
    for layer, cached in enumerate(cache.layers):
        torch.testing.assert_close(decoder.keys[layer][0, :, :3], cached.keys[0, :, 8:], atol=0, rtol=0)
        torch.testing.assert_close(decoder.values[layer][1, :, :11], cached.values[1], atol=0, rtol=0)
    heads, dim = decoder.kv_heads, decoder.head_dim
    assert decoder.memory_bytes == 2 * len(cache.layers) * 2 * heads * 256 * dim * 4  # 2 slots, 256 columns, fp32


def test_cache_grows_past_its_first_width(tiny_model):
    """A row longer than 256 columns grows the cache (to its bound, rounded up to 256) mid-batch."""
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)
    reqs = lambda: [request(PROMPTS[1], max_new_tokens=262, ignore_eos=True), request([2, 3], max_new_tokens=4)]  # noqa: E731
    want = run_schedule(dynamic, {0: reqs()})
    got = run_schedule(static, {0: reqs()})
    assert_same_results(got, want, LOGPROB_ATOL)
    assert static.slots.length == 512 and len(got[0].output_ids) == 262


def test_lone_requests_keep_the_prefix_cache(tiny_model):
    """A lone request's prefill and first decode step come from the prefix cache (the dynamic path), later steps
    from the slots: a repeat is bit-identical and reports its cached prompt tokens."""
    _, static = generators(tiny_model)
    first = static.generate([request(PROMPTS[1], max_new_tokens=8, ignore_eos=True)])[0]
    again = static.generate([request(PROMPTS[1], max_new_tokens=8, ignore_eos=True)])[0]
    assert again.output_ids == first.output_ids and again.output_logprobs == first.output_logprobs
    assert (first.cached_tokens, again.cached_tokens) == (0, len(PROMPTS[1]) - 1)
    assert static.prefix_cache.hits == 2 and static.slots.length == 256


def test_a_second_live_batch_decodes_on_the_dynamic_cache(tiny_model):
    """The slots are held by one batch at a time: another batch alive at once keeps the dynamic path, same outputs."""
    dynamic, static = generators(tiny_model, prefix_cache_tokens=0)
    want = run_schedule(dynamic, {0: mixed_requests()})
    holder = static.new_batch()
    holder.add([request([4, 9], max_new_tokens=50, ignore_eos=True), request([7], max_new_tokens=50)], [0, 1])
    holder.step()
    holder.step()
    assert holder.slots == [0, 1]
    got = run_schedule(static, {0: mixed_requests()})
    assert_same_results(got, want, LOGPROB_ATOL)
    assert holder.slots == [0, 1] and static.slots.taken == {0, 1}
    del holder  # a batch dropped mid-run gives the slots back
    assert run_schedule(static, {0: mixed_requests()}).keys() == want.keys() and not static.slots.taken


def test_where_the_static_path_applies(tiny_model):
    model, tok = tiny_model
    assert Generator(model, tok).slots is None  # cpu: the dynamic cache unless asked
    assert isinstance(Generator(model, tok).new_batch(), RunningBatch)
    assert Generator(model, tok, static_decode=True).slots.graphs is None  # eager off cuda
    with pytest.raises(ValueError, match="images"):
        Generator(model, tok, static_decode=True, vision=object())
    assert "route capture" in unsupported(model, capture_routes=True, batch_invariant=False, vision=None)
    assert "route capture" in unsupported(model, capture_routes=False, batch_invariant=True, vision=None)
    assert unsupported(model, capture_routes=False, batch_invariant=False, vision=None) is None
    assert mask_form(model) == "mapping"  # Qwen3 takes the per-layer-type mapping
    assert Generator(model, tok, static_decode=False, cuda_graphs=True).slots is None


def test_flush_frees_the_slots_unless_a_batch_holds_them(tiny_model):
    _, static = generators(tiny_model, prefix_cache_tokens=0)
    batch = static.new_batch()
    batch.add([request([4, 9], max_new_tokens=5)], [0])
    batch.step()
    batch.step()
    static.flush_cache()
    assert static.slots.memory_bytes > 0  # held: the batch decodes on
    while batch:
        batch.step()
    static.flush_cache()
    assert static.slots.memory_bytes == 0 and isinstance(static.slots, SlotDecoder)
