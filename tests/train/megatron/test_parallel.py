"""The megatron backend on CPU over gloo: every parallel layout equals the single-rank one.

Each case spawns the layout's ranks, computes forward-only log-probs of one shard, then runs one
optimizer step; the owner rank's log-probs must equal the single rank's to 1e-5 and the step's grad
norm to 1e-4 (relative). Layouts: TP=2 (without and with sequence parallelism), PP=2, CP=2 on the tiny dense
model; PP=2 of 2 and 1 layers on a 3-layer one; EP=2 on the tiny MoE; EP=2, PP=2 and TP=2 with sequence parallelism
on the tiny GLM-4.5 (experts split over tp) and DeepSeek-V3 (experts over ep 2): megatron splits MoE layers, and
latent attention, over tp with sequence parallelism only.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.assets.tiny_model import create_tiny_model  # noqa: E402
from slime.train.layout import RankLayout  # noqa: E402
from tests.helpers.compose import typed_config  # noqa: E402
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup  # noqa: E402
from tests.helpers.megatron_layouts import (  # noqa: E402
    assert_layouts_equal_one_rank,
    many_ranks,
    single_rank,
    tiny_option_dir,
)

SEQUENCE_PARALLEL = {"tp": 2, "sequence_parallel": True}
# megatron sums experts' gradients over tp ranks only through expert parallelism, or with the experts split over tp
EXPERTS_OVER_TP = {**SEQUENCE_PARALLEL, "etp": 2}
EXPERTS_OVER_EP = {**SEQUENCE_PARALLEL, "ep": 2}
LAYOUTS = {
    "dense": {"tp2": {"tp": 2}, "tp2_sp": SEQUENCE_PARALLEL, "pp2": {"pp": 2}, "cp2": {"cp": 2}},
    # experts split over the two data-parallel ranks
    "moe": {"ep2": {"dp": 2, "ep": 2}},
    # three layers over two stages of 2 and 1 (megatron's num_layers_in_first_pipeline_stage)
    "dense_3_layers": {"pp2_unequal": {"pp": 2, "pp_first_stage_layers": 2}},
    # GLM-4.5's and DeepSeek-V3's layers (a dense first layer; sigmoid router with a random expert-score bias, a
    # shared expert; DeepSeek's latent attention); pp 2 puts the dense layer and the MoE layer on different stages
    "glm4_moe": {"ep2": {"dp": 2, "ep": 2}, "pp2": {"pp": 2}, "tp2_sp_etp2": EXPERTS_OVER_TP},
    "deepseek_v3": {"ep2": {"dp": 2, "ep": 2}, "pp2": {"pp": 2}, "tp2_sp_ep2": EXPERTS_OVER_EP},
}
# kind -> the model option and its overrides (None: tiny_qwen3)
MODEL_OF_KIND = {
    "dense": (None, []),
    "moe": ("tiny_qwen3_moe", []),
    "dense_3_layers": ("tiny_qwen3", ["model.num_layers=3"]),
    "glm4_moe": ("tiny_glm4_moe", []),
    "deepseek_v3": ("tiny_deepseek_v3", []),
}


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_layouts_equal_single_rank(kind, tiny_model_dir, tmp_path):
    option, model_overrides = MODEL_OF_KIND[kind]
    model_dir = tiny_model_dir if option is None else tiny_option_dir(option, model_overrides, tmp_path / kind)
    base = ([f"model={option}", *model_overrides] if option else []) + [
        "parallelism=megatron",
        "parallelism.max_tokens_per_gpu=24",
        "train.lr=1e-2",
    ]
    assert_layouts_equal_one_rank(model_dir, base, LAYOUTS[kind], tmp_path, 29600 + 10 * list(LAYOUTS).index(kind))


@pytest.mark.slow
def test_virtual_pipeline_stages_equal_single_rank(tmp_path):
    """pp=4 with two virtual stages per rank (interleaved 1F1B) on an 8-layer model, four ranks.

    (pp=2 with virtual stages is rejected on CPU: both pipeline neighbours are the same gloo peer, and
    the interleaved schedule's batched sends in both directions then pair up wrongly.)
    """
    base = ["model.num_layers=8", "parallelism=megatron", "parallelism.max_tokens_per_gpu=24", "train.lr=1e-2"]
    model_dir = str(create_tiny_model(typed_config(base[:1]).model, tmp_path / "deep"))
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    one = single_rank(make_setup(model_dir, base), batch, 29690)
    wide = ["cluster.num_gpus_per_node=8", "cluster.actor.num_gpus_per_node=4", "parallelism.pp=4"]
    setup = make_setup(model_dir, [*base, *wide, "parallelism.vpp=2"])
    results = many_ranks({"vpp": (RankLayout(dp=1, pp=4), setup, [batch])}, tmp_path, 29691, world=4)
    torch.testing.assert_close(results["vpp"]["log_probs"], one["log_probs"], rtol=0, atol=1e-5)
    grad_norm = results["vpp"]["steps"][0]["train/grad_norm"]
    assert grad_norm == pytest.approx(one["steps"][0]["train/grad_norm"], rel=1e-4)
