"""HF weights into live sharded megatron models and back, on two gloo ranks: tp=2, pp=2 with virtual
stages, ep=2, tp=2 with ep=2 (also with latent attention). Each rank checks its own shards against the HF tensors
read directly, then the export (collective) against the checkpoint, bit for bit."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.net import free_port  # noqa: E402
from tests.helpers.megatron_checkpoints import make_checkpoint  # noqa: E402
from tests.helpers.megatron_layouts import RANK_DIMS  # noqa: E402

# (family, checkpoint overrides, parallel sizes): untied with bias over tp; tied over pp (the last stage
# holds a copy of the embedding) with 2 virtual stages of 4 layers; MoE over ep, and over tp and ep; DeepSeek-V3's
# latent attention over tp (its down-projections whole on each rank) with sequence parallelism
LAYOUTS = [
    ("qwen2", {}, {"tp": 2}),
    ("qwen3", {"num_layers": 4}, {"pp": 2, "vpp": 2}),
    ("qwen3_moe", {}, {"ep": 2}),
    ("qwen3_moe", {}, {"tp": 2, "ep": 2}),
    ("deepseek_v3", {}, {"tp": 2, "ep": 2, "sequence_parallel": True}),
]


def _check_local_shards(chunks, model, sizes) -> None:
    """Independent of the split code: a rank's qkv rows are its query groups' q, k, v rows; its experts are
    the HF experts local_expert_indices name; its fc2 columns are its half of down_proj."""
    from megatron.core import parallel_state as ps

    from slime.train.megatron.hf_weights import unwrap
    from slime.train.megatron.weights.hf_reader import HFReader

    reader = HFReader(model.hf_checkpoint)
    tp, tp_rank = sizes.get("tp", 1), ps.get_tensor_model_parallel_rank()
    d, per_group = model.kv_channels, model.num_attention_heads // model.num_query_groups
    groups = model.num_query_groups // tp
    for chunk in unwrap(chunks):
        for layer in chunk.decoder.layers:
            hf = f"model.layers.{layer.layer_number - 1}."
            if model.kv_lora_rank is not None:
                _check_latent_shards(layer.self_attention, reader, hf, tp, tp_rank)
                continue
            q, k, v = (reader.get(f"{hf}self_attn.{p}_proj.weight") for p in "qkv")
            rows = []
            for g in range(tp_rank * groups, (tp_rank + 1) * groups):
                rows += [q[g * per_group * d : (g + 1) * per_group * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
            assert torch.equal(layer.self_attention.linear_qkv.weight, torch.cat(rows))
            if model.num_experts is None:
                continue
            for j, e in enumerate(layer.mlp.local_expert_indices):
                expert = layer.mlp.experts.local_experts[j]
                down = reader.get(f"{hf}mlp.experts.{e}.down_proj.weight")
                assert torch.equal(expert.linear_fc2.weight, down)  # experts are not tp-split (etp=1)


def _check_latent_shards(attention, reader, hf: str, tp: int, tp_rank: int) -> None:
    """The down-projections whole on every rank; the up-projections' rows this rank's heads' (HF lays them out
    head by head)."""
    assert torch.equal(attention.linear_kv_down_proj.weight, reader.get(f"{hf}self_attn.kv_a_proj_with_mqa.weight"))
    assert torch.equal(attention.linear_q_down_proj.weight, reader.get(f"{hf}self_attn.q_a_proj.weight"))
    for ours, theirs in (("linear_kv_up_proj", "kv_b_proj"), ("linear_q_up_proj", "q_b_proj")):
        whole = reader.get(f"{hf}self_attn.{theirs}.weight")
        assert torch.equal(getattr(attention, ours).weight, whole.chunk(tp)[tp_rank])


def _worker(rank: int, port: int, cases: list) -> None:
    from megatron.core import parallel_state as ps

    from slime.config.schema import ParallelismConfig
    from slime.train.layout import RankLayout
    from slime.train.megatron import hf_weights, parallel
    from slime.train.megatron.model_config import build_model_chunks, transformer_config
    from slime.train.megatron.weights.hf_reader import HFReader

    torch.set_num_threads(1)
    for model, sizes in cases:
        layout_sizes = {k: v for k, v in sizes.items() if k in RANK_DIMS}  # vpp, sequence_parallel: the config's
        layout = RankLayout.for_world(2, **layout_sizes)
        parallel.init(
            device="cpu",
            rank=rank,
            layout=layout,
            vpp=sizes.get("vpp"),
            master_addr="127.0.0.1",
            master_port=port,
            seed=1,
        )
        # building only (no forward): megatron's allgather dispatcher constructs on CPU
        extra = {"moe_token_dispatcher_type": "allgather", "variable_seq_lengths": False} if model.num_experts else {}
        config = transformer_config(
            model, ParallelismConfig(**sizes), params_dtype=torch.float32, device="cpu", extra=extra
        )
        chunks = build_model_chunks(model, config)
        assert hf_weights.load_hf(chunks, model.hf_checkpoint, model) == len(list(hf_weights.local_parameters(chunks)))
        _check_local_shards(chunks, model, sizes)
        exported = [pair for bucket in hf_weights.export_hf(chunks, model, 1 << 14) for pair in bucket]
        reader = HFReader(model.hf_checkpoint)
        assert sorted(name for name, _ in exported) == sorted(reader.names()), sizes
        for name, tensor in exported:
            assert torch.equal(tensor, reader.get(name)), (sizes, name)
        ps.destroy_model_parallel()
    parallel.destroy()


def test_load_and_export_on_two_ranks(tmp_path):
    cases = [(make_checkpoint(family, tmp_path, **over), sizes) for family, over, sizes in LAYOUTS]
    torch.multiprocessing.spawn(_worker, args=(free_port(), cases), nprocs=2, join=True)
