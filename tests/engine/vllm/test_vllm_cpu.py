"""What a vLLM server on CPU needs from the framework (slime/engine/vllm/cpu.py): validation before anything starts,
the launch's defaults, and the untied view of a tied checkpoint, checked against the installed vLLM's own code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from slime.engine.base import EngineLaunch
from slime.engine.vllm import cpu
from slime.engine.vllm.engine import VLLMEngine, VLLMEngineConfig
from slime.plan.validate import validate
from tests.helpers.compose import ROOT, model_fields, typed_config
from tests.helpers.validation import config_problems


def test_what_a_cpu_vllm_cannot_do_is_refused_naming_the_fix():
    found = config_problems(["rollout=vllm"])  # the embedded model: head size 16, and vllm's distributed default
    assert "head sizes [32, 64" in found["model.kv_channels"] and "model=tiny_qwen3_vllm" in found["model.kv_channels"]
    assert "rollout.weight_sync.mode=disk" in found["rollout.weight_sync.mode"]
    found = config_problems(["model=tiny_qwen3_vllm", "rollout.weight_sync.mode=tensor", "cluster.colocate=true"])
    assert "IPC transfer and sleep mode" in found["rollout.weight_sync.mode"]
    assert "--enable-sleep-mode" in found["cluster.colocate"]
    validate(typed_config(["model=tiny_qwen3_vllm"]))  # its preset: rollout=vllm with disk syncs


def test_the_cpu_head_sizes_are_vllms():
    """The list validation uses is the installed vLLM's (`CPUAttentionBackend.get_supported_head_sizes`)."""
    code = (
        "from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as B; print(B.get_supported_head_sizes())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert tuple(json.loads(out.stdout.strip().splitlines()[-1])) == cpu.CPU_ATTENTION_HEAD_SIZES


def make_engine(model_path: str, log_dir, *, device: str = "cpu", dtype: str = "float32", **args) -> VLLMEngine:
    launch = EngineLaunch(
        rank=0, model_path=model_path, host="127.0.0.1", seed=0, device=device, log_dir=str(log_dir), dtype=dtype
    )
    return VLLMEngine(launch, VLLMEngineConfig(args=args, weight_transfer_backend=None))


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_launch_serves_a_tied_checkpoint_untied_in_the_trainers_dtype_with_a_sized_kv_cache(tmp_path):
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = {**model_fields("tiny_qwen3_vllm"), "hf_checkpoint": str(tmp_path / "tied")}
    tied = str(create_tiny_model(ModelConfig(**fields)))
    engine = make_engine(tied, tmp_path / "logs")
    view = engine.served_path()
    cpu.untied_view(tied, view)
    argv = engine.command([8000, 8001])
    assert flag(argv, "--model") == view and flag(argv, "--served-model-name") == tied
    assert flag(argv, "--dtype") == "float32" and flag(argv, "--kv-cache-memory-bytes") == str(1 << 30)
    assert "--enable-scale-out" in argv
    assert (
        json.loads((tmp_path / "logs" / "engine_0_untied_model" / "config.json").read_text())["tie_word_embeddings"]
        is False
    )
    assert cpu.is_tied(tied)  # the checkpoint itself is untouched
    weights = {**load_file(f"{view}/model-base.safetensors"), **load_file(f"{view}/{cpu.LM_HEAD_FILE}")}
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    sized = make_engine(tied, tmp_path / "logs2", kv_cache_memory_bytes=123, dtype="bfloat16").command([1, 2])
    assert flag(sized, "--kv-cache-memory-bytes") == "123"
    on_gpu = make_engine("/models/qwen", tmp_path / "logs3", device="cuda", dtype="bfloat16")
    gpu_argv = on_gpu.command([1, 2])
    assert flag(gpu_argv, "--model") == "/models/qwen" and "--kv-cache-memory-bytes" not in gpu_argv
    assert flag(gpu_argv, "--dtype") == "bfloat16" and "--served-model-name" not in gpu_argv


def test_a_pushed_tied_checkpoint_gets_its_lm_head(tmp_path):
    """Disk sync into vLLM: the pushed directory is untied in place, the index lists the head, twice is once."""
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    embed = torch.randn(80, 64)
    save_file(
        {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(64)}, str(tmp_path / "a.safetensors")
    )
    index = {"weight_map": {"model.embed_tokens.weight": "a.safetensors", "model.norm.weight": "a.safetensors"}}
    (tmp_path / cpu.INDEX_FILE).write_text(json.dumps(index))
    from slime.engine.vllm.client import VLLMClient

    for _ in range(2):
        VLLMClient.prepare_disk_checkpoint(str(tmp_path))
    assert torch.equal(load_file(str(tmp_path / cpu.LM_HEAD_FILE))["lm_head.weight"], embed)
    assert json.loads((tmp_path / cpu.INDEX_FILE).read_text())["weight_map"]["lm_head.weight"] == cpu.LM_HEAD_FILE
    assert not cpu.is_tied(tmp_path)


@pytest.mark.parametrize("model", ["tiny_qwen3_vllm", "tiny_qwen3_vllm_untied"])
def test_the_tiny_vllm_models_are_the_embedded_model_with_vllms_head_size(model):
    cfg, embedded = typed_config([f"model={model}"]).model, typed_config([]).model
    assert cfg.kv_channels == 32 and embedded.kv_channels == 16
    assert cfg.tie_word_embeddings is (model == "tiny_qwen3_vllm")
    assert (cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == (embedded.num_layers, embedded.hidden_size, 80)
