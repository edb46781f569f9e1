"""Manual GPU-tier smoke check of the hf engine (not collected by pytest; needs CUDA).

    python tests/engine/gpu_smoke.py [workdir]

Creates a tiny Qwen3, then on CUDA in bf16: log-prob parity of the batched, KV-cached generator
against an uncached forward; one server process (HFEngine) doing /generate, release/resume of
weights (device memory must drop and come back) and a disk weight update; and a throughput line.
Needs torch, transformers, tokenizers, safetensors, aiohttp; not omegaconf, Ray or the router.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu only to check the script itself
sys.path.insert(0, str(ROOT))

from slime.assets.tokenizer import build_tokenizer  # noqa: E402
from slime.engine import http_client  # noqa: E402
from slime.engine.hf.engine import HFEngine  # noqa: E402
from slime.engine.hf.generator import GenerationRequest, Generator  # noqa: E402
from slime.engine.hf.sampling import SamplingParams  # noqa: E402


def make_model(path: Path, hidden=64, layers=2, heads=4, kv_heads=2, ffn=192) -> str:
    """A random Qwen3 with the word-level test tokenizer (no omegaconf needed)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = build_tokenizer(path)
    config = Qwen3Config(vocab_size=80, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, rope_theta=10000.0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return str(path)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def parity(model_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    gen = Generator(model, AutoTokenizer.from_pretrained(model_dir), seed=0)
    prompts = [[1, 5, 11], [1, 5, 11, 16, 28, 23, 29, 62, 2, 1, 7], [4, 9]]
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, top_k=20, ignore_eos=True)
    results = gen.generate([GenerationRequest(p, params) for p in prompts])
    worst = 0.0
    for p, r in zip(prompts, results):
        logits = model(input_ids=torch.tensor([p + r.output_ids], device=DEVICE)).logits[0].float()
        ref = torch.log_softmax(logits / 0.8, -1)[len(p) - 1 : -1]
        ref = ref.gather(1, torch.tensor(r.output_ids, device=DEVICE)[:, None]).squeeze(1).cpu()
        worst = max(worst, (ref - torch.tensor(r.output_logprobs)).abs().max().item())
    print(f"[parity] bf16 {DEVICE}: max |logprob - uncached logprob| = {worst:.4f}", flush=True)
    gen.generate([GenerationRequest(p, params) for p in prompts * 30])  # warm-up: lazy CUDA module loading
    for bs in (1, 64, 256):
        reqs = [GenerationRequest(prompts[i % 3], SamplingParams(max_new_tokens=128, ignore_eos=True)) for i in range(bs)]
        _sync()
        t0 = time.perf_counter()
        gen.generate(reqs)
        _sync()
        dt = time.perf_counter() - t0
        print(f"[throughput] batch {bs} x 128 tokens: {dt:.2f} s, {bs * 128 / dt:.0f} tok/s", flush=True)


def server(model_dir: str, work: Path) -> None:
    cfg = SimpleNamespace(max_batch_size=64, batch_wait_ms=5.0, dtype="bfloat16", num_threads=4, startup_timeout_s=180)
    engine = HFEngine(model_path=model_dir, rank=0, host="127.0.0.1", seed=1, device=DEVICE, cfg=cfg,
                      log_dir=str(work / "logs"))
    body = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    try:
        engine.start()
        info = lambda: http_client.get(engine.url + "/server_info")  # noqa: E731
        first = http_client.post(engine.url + "/generate", body)
        print("[server] generate:", json.dumps(first)[:300], "dtype:", info()["dtype"], flush=True)
        mem = info()["device_memory_allocated_bytes"]
        engine.release_memory()
        released = info()["device_memory_allocated_bytes"]
        assert http_client.request("POST", engine.url + "/generate", body)[0] == 400
        engine.resume_memory()
        print(f"[server] device memory: {mem} -> released {released} -> resumed {info()['device_memory_allocated_bytes']}")
        again = http_client.post(engine.url + "/generate", body)
        assert again["output_ids"] == first["output_ids"], (again, first)
        from safetensors.torch import load_file, save_file

        new_dir = work / "weights_v1"
        new_dir.mkdir()
        tensors = {k: v + 0.3 * torch.randn_like(v) for k, v in load_file(f"{model_dir}/model.safetensors").items()}
        save_file(tensors, str(new_dir / "model.safetensors"))
        engine.pause_generation()
        engine.flush_cache()
        engine.update_weights_from_disk(str(new_dir), weight_version="1")
        engine.continue_generation()
        after = http_client.post(engine.url + "/generate", body)
        assert after["meta_info"]["weight_version"] == "1" and after["output_ids"] != first["output_ids"]
        print("[server] release/resume/update OK", flush=True)
    finally:
        engine.shutdown()
        print("[server] log tail:\n" + (work / "logs" / "engine_0.log").read_text()[-1500:], flush=True)


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hf_gpu_smoke_"))
    work.mkdir(parents=True, exist_ok=True)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}")
    model_dir = make_model(work / "tiny")
    parity(model_dir)
    server(model_dir, work)


if __name__ == "__main__":
    main()
