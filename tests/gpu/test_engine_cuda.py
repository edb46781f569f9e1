"""GPU tier: the built-in hf engine on CUDA in bf16 (generator parity, server memory release, weight update)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slime.engine import http_client
from slime.engine.base import EngineLaunch
from slime.engine.hf.engine import HFEngine
from slime.engine.hf.generator import GenerationRequest, Generator
from slime.engine.hf.sampling import SamplingParams

pytestmark = pytest.mark.gpu


@torch.inference_mode()
def test_batched_cached_generation_matches_an_uncached_forward(tiny_model_dir):
    """Sampled tokens' log-probs (logits / T) equal an uncached bf16 forward's, to bf16 rounding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).to("cuda").eval()
    gen = Generator(model, AutoTokenizer.from_pretrained(str(tiny_model_dir)), seed=0)
    prompts = [[1, 5, 11], [1, 5, 11, 16, 28, 23, 29, 62, 2, 1, 7], [4, 9]]
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, top_k=20, ignore_eos=True)
    results = gen.generate([GenerationRequest(p, params) for p in prompts])
    for prompt, result in zip(prompts, results):
        assert len(result.output_ids) == 16
        logits = model(input_ids=torch.tensor([prompt + result.output_ids], device="cuda")).logits[0].float()
        ref = torch.log_softmax(logits / 0.8, -1)[len(prompt) - 1 : -1]
        ref = ref.gather(1, torch.tensor(result.output_ids, device="cuda")[:, None]).squeeze(1).cpu()
        assert (ref - torch.tensor(result.output_logprobs)).abs().max() < 0.05


def test_server_releases_memory_and_reloads_weights_on_cuda(tiny_model_dir, tmp_path: Path):
    from safetensors.torch import load_file, save_file

    cfg = SimpleNamespace(
        max_batch_size=64,
        batch_wait_ms=5.0,
        dtype="bfloat16",
        num_threads=4,
        prefix_cache_tokens=8192,
        startup_timeout_s=180,
    )
    launch = EngineLaunch(
        rank=0,
        model_path=str(tiny_model_dir),
        host="127.0.0.1",
        seed=1,
        device="cuda",
        log_dir=str(tmp_path / "logs"),
        startup_timeout_s=180,
    )
    engine = HFEngine(launch, cfg)
    body = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    try:
        engine.start()
        info = lambda: http_client.get(engine.url + "/server_info")  # noqa: E731
        first = http_client.post(engine.url + "/generate", body)
        assert info()["dtype"] in ("bfloat16", "torch.bfloat16")
        held = info()["device_memory_allocated_bytes"]
        engine.client.release_memory()
        assert info()["device_memory_allocated_bytes"] < held
        assert http_client.request("POST", engine.url + "/generate", body)[0] == 400
        engine.client.resume_memory()
        assert http_client.post(engine.url + "/generate", body)["output_ids"] == first["output_ids"]
        new_dir = tmp_path / "weights_v1"
        new_dir.mkdir()
        weights = load_file(f"{tiny_model_dir}/model.safetensors")
        save_file({k: v + 0.3 * torch.randn_like(v) for k, v in weights.items()}, str(new_dir / "model.safetensors"))
        engine.client.pause_generation()
        engine.client.flush_cache()
        engine.client.update_weights_from_disk(str(new_dir), weight_version="1")
        engine.client.continue_generation()
        after = http_client.post(engine.url + "/generate", body)
        assert after["meta_info"]["weight_version"] == "1" and after["output_ids"] != first["output_ids"]
    finally:
        engine.shutdown()


def _graph_schedule() -> dict:
    """Rows finishing at different lengths, and one joining (into the slot of the first to finish) after 8 steps."""
    from tests.helpers.static_decode import request

    first = [request(p, max_new_tokens=n, ignore_eos=True) for p, n in (([1, 5, 11], 6), ([4, 9], 30))]
    first.append(request([1, 5, 11, 16, 28, 23, 29, 62, 2, 1, 7], max_new_tokens=20, ignore_eos=True))
    return {0: first, 8: [request([1, 30, 31, 32], max_new_tokens=12, ignore_eos=True)]}


def _graph_and_dynamic(model_dir, dtype) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to("cuda").eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    graphs = Generator(model, tok, seed=0, prefix_cache_tokens=0)
    dynamic = Generator(model, tok, seed=0, prefix_cache_tokens=0, cuda_graphs=False)
    assert graphs.slots is not None and graphs.slots.graphs is not None and dynamic.slots is None
    return model, graphs, dynamic


@torch.inference_mode()
def test_cuda_graph_decoding_gives_the_dynamic_caches_tokens(tiny_model_dir):
    """The static cache with CUDA graphs (the engine's default on cuda) against the dynamic cache, in float32 (no
    bf16 near-ties between the two summation orders): the same greedy tokens and finish reasons, log-probs to float32
    rounding, with rows finishing at different lengths and a row joining; a second run replays the graphs."""
    from tests.helpers.static_decode import assert_same_results, run_schedule

    _, graphs, dynamic = _graph_and_dynamic(tiny_model_dir, torch.float32)
    want = run_schedule(dynamic, _graph_schedule())
    for _ in range(2):
        assert_same_results(run_schedule(graphs, _graph_schedule()), want, atol=1e-4)
    assert len(graphs.slots.graphs) >= 2  # 4 slots, then fewer once rows leave


@torch.inference_mode()
def test_cuda_graph_decoding_logprobs_in_bf16(tiny_model_dir):
    """In bf16 (the engine's dtype on cuda) the graphs' log-probs equal an uncached forward's to bf16 rounding."""
    from tests.helpers.static_decode import run_schedule

    model, graphs, _ = _graph_and_dynamic(tiny_model_dir, torch.bfloat16)
    schedule = _graph_schedule()
    prompts = [r.input_ids for step in sorted(schedule) for r in schedule[step]]
    results = run_schedule(graphs, schedule)
    for key, prompt in enumerate(prompts):
        out = results[key].output_ids
        logits = model(input_ids=torch.tensor([prompt + out], device="cuda")).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        ref = ref.gather(1, torch.tensor(out, device="cuda")[:, None]).squeeze(1).cpu()
        assert (ref - torch.tensor(results[key].output_logprobs)).abs().max() < 0.05
