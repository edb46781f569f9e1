"""LoRA on the fsdp backend (model.lora): what trains, what engines receive, what a checkpoint holds, and the
configs refused before anything starts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slime.config.schema_lora import LoRAConfig
from slime.train.fsdp import lora
from tests.helpers.compose import LORA_ALONE, typed_config
from tests.helpers.fsdp_rank import (
    batches_for,
    log_probs,
    make_backend,
    make_samples,
    make_setup,
    response_log_probs,
    train_rollout,
)
from tests.helpers.validation import config_problems

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny(model_dir, lora_cfg: LoRAConfig):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora.apply_lora(model, lora_cfg)
    return model


def with_lora(model, **fields):
    return dataclasses.replace(model, lora=dataclasses.replace(model.lora, **fields))


def test_on_a_bf16_base_what_trains_is_fp32_and_merges_from_it(tiny_model_dir):
    """The frozen base in bf16 (FSDP2's bf16 policy on CUDA): peft gives new adapters the base's dtype, apply_lora
    makes what trains fp32; the merged weight is the bf16 base plus the fp32 product, rounded once to bf16."""
    cfg = with_lora(typed_config(["model.lora.rank=4"]).model, train_params=["model.norm.weight"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    lora.apply_lora(model, cfg.lora)
    params = dict(model.named_parameters())
    trained = {n for n, p in params.items() if p.requires_grad}
    assert trained == {n for n in params if lora.is_adapter(n)} | {"model.norm.weight"}
    assert {params[n].dtype for n in trained} == {torch.float32}
    assert {p.dtype for n, p in params.items() if n not in trained} == {torch.bfloat16}
    with torch.no_grad():
        params["model.layers.0.self_attn.q_proj.lora_B.default.weight"].normal_()
    merged = dict(lora.merged_weights(model, lambda t: t))
    layer = model.model.layers[0].self_attn.q_proj
    delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]
    base = params["model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], (base.float() + delta).bfloat16())


def test_only_the_adapters_train_and_their_count_is_the_formula(tiny_model_dir):
    cfg = with_lora(typed_config(["model.lora.rank=4"]).model, train_params=[])
    model = tiny(tiny_model_dir, cfg.lora)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    # tiny_qwen3: L 2, H 64, Q 64, KV 32, F 192: per layer 4·[(64+64) + 2·(64+32) + (64+64) + 2·(64+192) + (192+64)]
    assert sum(trainable.values()) == cfg.lora.parameter_count(cfg) == 2 * 4 * (128 + 192 + 128 + 512 + 256)
    only_q = with_lora(cfg, target_modules=["q_proj"])
    assert sum(p.numel() for p in tiny(tiny_model_dir, only_q.lora).parameters() if p.requires_grad) == 2 * 4 * 128
    # the embedded preset's norm gain trains whole beside them: hidden_size more
    gains = with_lora(cfg, train_params=["model.norm.weight", "model.layers.1.input_layernorm.weight"])
    trainable = {n for n, p in tiny(tiny_model_dir, gains.lora).named_parameters() if p.requires_grad}
    assert {"model.norm.weight", "model.layers.1.input_layernorm.weight"} <= trainable
    assert gains.lora.parameter_count(gains) == cfg.lora.parameter_count(cfg) + 2 * 64


def test_engines_get_the_base_weights_with_peft_s_own_merge_of_the_adapters(tiny_model_dir):
    plain = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())
    model = tiny(tiny_model_dir, LoRAConfig(rank=4, alpha=8.0, target_modules=TARGETS))
    fresh = dict(lora.merged_weights(model, lambda t: t))
    assert fresh.keys() == plain.keys()  # the base's HF names, adapters left out
    assert all(torch.equal(fresh[n], plain[n]) for n in plain)  # B starts at zero: the merge is the base
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_()
    merged = dict(lora.merged_weights(model, lambda t: t))
    for module in model.modules():  # peft's merge into the base, the reference
        if hasattr(module, "merge") and hasattr(module, "lora_A"):
            module.merge()
    expected = {n.replace(lora.BASE, ""): p for n, p in model.named_parameters() if not lora.is_adapter(n)}
    changed = [n for n in plain if not torch.equal(merged[n], plain[n])]
    assert sorted(changed) == sorted(n for n in plain if n.split(".")[-2] in TARGETS)
    assert all(torch.allclose(merged[n], expected[n], atol=1e-6, rtol=0) for n in plain)


def test_a_checkpoint_holds_the_adapters_and_resumes_them_exactly(tiny_model_dir, tmp_path):
    setup = make_setup(tiny_model_dir, ["model.lora.rank=4", "train.lr=1e-2"])
    backend = make_backend(setup)
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    train_rollout(backend, batch)
    backend.save_checkpoint(0, str(tmp_path))
    saved = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    files = sorted(p.name for p in (tmp_path / "iter_0000000" / "model").iterdir())
    assert files == ["adapter_model.safetensors"]  # the base is model.hf_checkpoint, never trained
    written = load_file(tmp_path / "iter_0000000" / "model" / "adapter_model.safetensors")
    assert set(written) == {n for n, p in backend.model.named_parameters() if p.requires_grad}
    backend.shutdown()
    resumed = make_backend(make_setup(tiny_model_dir, ["model.lora.rank=4", "train.lr=1e-2"]))
    assert resumed.load_checkpoint(str(tmp_path), None) == 1
    state = dict(resumed.model.named_parameters())
    assert state.keys() == saved.keys() and all(torch.equal(state[n], saved[n]) for n in saved)
    assert any(not torch.equal(saved[n], p) for n, p in make_backend_params(tiny_model_dir).items())
    resumed.shutdown()


def test_the_kl_reference_is_the_frozen_base_without_a_second_copy(tiny_model_dir):
    kl = ["model.lora.rank=4", "train.lr=1e-2", "algo.use_kl_loss=true", "algo.kl_loss_coef=0.1"]
    backend = make_backend(make_setup(tiny_model_dir, [*kl, f"checkpoint.ref_load={tiny_model_dir}"]))
    assert backend.frozen["ref"] is backend.model
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    for _ in range(2):  # the adapters and the final norm's gain move away from the base
        train_rollout(backend, batch)
    trained = log_probs(backend, batch, "old")
    reference = log_probs(backend, batch, "ref")
    plain = make_backend(make_setup(tiny_model_dir))
    base = log_probs(plain, batch, "old")
    plain.shutdown()
    assert (trained - base).abs().max() > 1e-3  # the policy moved
    assert torch.allclose(reference, base, atol=1e-6, rtol=0)  # the reference did not
    assert torch.equal(log_probs(backend, batch, "old"), trained)  # and the policy came back whole
    backend.shutdown()


def test_the_hf_export_is_a_peft_adapter_that_peft_loads_onto_the_base(tiny_model_dir, tmp_path):
    """checkpoint.save_hf with LoRA: peft's own PeftModel.from_pretrained over the base scores as the trainer does;
    model.lora.export_merged adds the merged model, which transformers loads to the same scores."""
    from peft import PeftModel

    setup = make_setup(tiny_model_dir, ["model.lora.rank=4", "train.lr=1e-2", "model.lora.export_merged=true"])
    backend = make_backend(setup)
    train_rollout(backend, batches_for(make_samples(8, seed=3), dp=1, k=1)[0])
    backend.save_hf(str(tmp_path / "hf"))
    prompt, response = [5, 9, 11, 20], [33, 7, 12]
    ours = response_log_probs(backend, prompt, response)
    backend.shutdown()

    def scored(model) -> torch.Tensor:  # the response's log-probs from a plain transformers forward
        with torch.no_grad():
            logits = model.eval()(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]

    def load(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    plain = scored(load(tiny_model_dir))
    peft = scored(PeftModel.from_pretrained(load(tiny_model_dir), str(tmp_path / "hf")))
    merged = scored(load(tmp_path / "hf" / "merged"))
    assert (ours - plain).abs().max() > 1e-3  # trained away from the base
    assert torch.allclose(peft, ours, atol=1e-5, rtol=0) and torch.allclose(merged, ours, atol=1e-5, rtol=0)


def test_an_hf_directory_given_as_checkpoint_load_becomes_the_base(tiny_model_dir, tmp_path):
    """checkpoint.load=<HF dir> (no tracker: fine-tune from it) with LoRA: its weights go under the injected names
    (`.base_layer`), the adapters keep their start, so the policy scores as that model does."""
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(1.5)
    other.save_pretrained(tmp_path / "other")
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    backend = make_backend(make_setup(tiny_model_dir, ["model.lora.rank=4", f"checkpoint.load={tmp_path / 'other'}"]))
    ours = log_probs(backend, batch)
    backend.shutdown()
    plain = make_backend(make_setup(tmp_path / "other"))
    assert torch.allclose(ours, log_probs(plain, batch), atol=1e-6, rtol=0)
    plain.shutdown()


def make_backend_params(model_dir) -> dict[str, torch.Tensor]:
    """A fresh LoRA backend's parameters (the adapters at their initialisation)."""
    backend = make_backend(make_setup(model_dir, ["model.lora.rank=4"]))
    params = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    backend.shutdown()
    return params


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["model.lora.rank=8", "parallelism=megatron"], "model.lora.rank", "megatron backend trains no LoRA"),
        (["model.lora.rank=8", "parallelism.tp=2"], "model.lora.rank", "tensor-parallel"),
        (["model.lora.rank=8", "model.lora.target_modules=[qkv]"], "model.lora.target_modules", "['qkv']"),
        (["model.lora.rank=-1"], "model.lora.rank", ">= 0"),
        (["model.lora.rank=8", "model.lora.alpha=0"], "model.lora.alpha", "> 0"),
        (["model.lora.rank=8", "model.lora.init=pissa"], "model.lora.init", "default"),
        (
            ["model.lora.rank=8", "model.lora.train_params=[model.layers.2.input_layernorm.weight]"],
            "model.lora.train_params",
            "2-layer",
        ),
        (["model.lora.rank=8", "model.lora.train_params=[lm_head.weight]"], "model.lora.train_params", "RMSNorm gain"),
        (["model.lora.rank=8", "model.lora.lr=0"], "model.lora.lr", "> 0"),
        (["model.lora.rank=8", "model=tiny_qwen3_moe"], "model.lora.rank", "MoE"),
    ],
)
def test_a_lora_config_no_backend_can_train_is_refused(overrides, key, says):
    problems = config_problems(overrides)
    assert says in problems.get(key, ""), problems


ALONE = list(LORA_ALONE)
TENSOR = ["rollout.weight_sync.mode=tensor", "cluster.colocate=true"]
GAINS = ["model.lora.rank=8", "model.lora.train_params=[model.norm.weight]", "model.lora.sync_merged=false"]


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        ([*ALONE, "rollout.weight_sync.mode=distributed"], "rollout.weight_sync.mode", "moves full weights only"),
        (
            [*GAINS, "cluster=one_gpu", "rollout=sglang_colocated", "debug.check_weight_update_equal=true"],
            "debug.check_weight_update_equal",
            "hashes a GPU tensor with a hash of its own",
        ),
        ([*ALONE, "debug.check_weight_update_equal=true"], "debug.check_weight_update_equal", "no checksums"),
        ([*ALONE, *TENSOR, "model=tiny_qwen3_vllm"], "rollout.engine", "in disk mode only, not tensor"),
        ([*ALONE, "+rollout.sglang.max_lora_rank=16"], "rollout.sglang", "set by the adapter sync"),
    ],
)
def test_an_adapter_sync_the_run_cannot_make_is_refused(overrides, key, says):
    problems = config_problems(overrides)
    assert says in problems.get(key, ""), problems


def test_the_adapter_sync_config_is_what_peft_writes_and_the_runs_that_use_it_validate():
    from slime.plan.validate import validate

    adapters = typed_config([*ALONE, *TENSOR]).model.lora
    written = lora.peft_config(adapters, task_type="CAUSAL_LM").to_dict()  # as write_peft_adapter writes it
    ours = adapters.adapter_config()
    assert {key: written[key] for key in ours if key != "target_modules"} == {
        k: v for k, v in ours.items() if k != "target_modules"
    }
    assert sorted(written["target_modules"]) == ours["target_modules"]
    validate(typed_config([*ALONE, *TENSOR]))
    validate(typed_config([*ALONE, *TENSOR, "debug.check_weight_update_equal=true"]))  # SGLang's expected_checksums
    validate(typed_config(ALONE))  # the embedded run's disk mode: a peft directory
    validate(typed_config([*ALONE, "model=tiny_qwen3_vllm"]))  # a real vLLM on CPU: disk mode
    # the trained gain rides along with the adapter, checked after each push on engines that hash on the CPU
    validate(typed_config([*GAINS, *TENSOR, "debug.check_weight_update_equal=true"]))
    validate(typed_config([*GAINS, "model=tiny_qwen3_vllm"]))  # vLLM reloads the gain from disk
    validate(typed_config(["model.lora.rank=8", "model.lora.sync_merged=true"]))  # or the merged weights move
