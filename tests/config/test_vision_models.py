"""Vision-language model options (Qwen2.5-VL 3B and 7B; their parameter counts: test_model_families.py): a published
config.json matches the option in either spelling (transformers 4's flat one, transformers 5's nested one), and a
launch is refused before anything starts until training on images exists, while the dry run plans it."""

from __future__ import annotations

import copy
import dataclasses

from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

from slime.config.schema_vision import VisionConfig
from slime.models.families import mismatches
from slime.models.hf_vision import check_vision
from slime.plan.dry_run import dry_run
from tests.helpers.compose import typed_config
from tests.helpers.validation import config_problems

# Qwen/Qwen2.5-VL-7B-Instruct's config.json (the language model's keys at the top, as published for transformers 4)
HUB_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "tie_word_embeddings": False,
    "vocab_size": 152064,
    "image_token_id": 151655,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
}
# Qwen/Qwen3-VL-8B-Instruct's config.json (written by transformers 4.57: the language model in text_config)
HUB_QWEN3_VL_8B = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_vl_text",
        "attention_bias": False,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": False,
        "vocab_size": 151936,
    },
    "vision_config": {
        "model_type": "qwen3_vl",
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "intermediate_size": 4304,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
TOWER = {"depth": 2, "hidden_size": 32, "ffn_hidden_size": 48, "num_heads": 2}
PLAN = ["data.prompt_data=/nonexistent/train.jsonl", "rollout.rm_type=exact_match"]


def test_a_published_config_json_matches_the_option_in_either_spelling():
    model = typed_config(["model=qwen2_5_vl_7b"]).model
    assert mismatches(model, HUB_7B) == []
    assert mismatches(model, Qwen2_5_VLConfig(**HUB_7B).to_dict()) == []  # transformers 5: text_config, rope_parameters
    other = copy.deepcopy(HUB_7B)
    other["vision_config"]["depth"], other["num_hidden_layers"] = 16, 36
    assert mismatches(model, other) == [("vision.depth", 32, 16), ("num_layers", 28, 36)]
    no_tower = {k: v for k, v in HUB_7B.items() if k != "vision_config"}
    assert ("vision", model.vision, None) in mismatches(model, no_tower)


def test_the_newest_familys_published_config_json_matches_its_option():
    """Qwen3-VL (the newest Qwen VL family transformers 5 builds as a dense model): its config.json as published
    and as transformers 5 writes it."""
    model = typed_config(["model=qwen3_vl_8b"]).model
    assert mismatches(model, HUB_QWEN3_VL_8B) == []
    assert mismatches(model, Qwen3VLConfig(**HUB_QWEN3_VL_8B).to_dict()) == []
    other = copy.deepcopy(HUB_QWEN3_VL_8B)
    other["vision_config"]["deepstack_visual_indexes"] = [5, 11, 17]
    other["text_config"]["rope_scaling"]["mrope_section"] = [16, 24, 24]
    assert mismatches(model, other) == [
        ("vision.deepstack_visual_indexes", [8, 16, 24], [5, 11, 17]),
        ("rope_scaling", {"mrope_section": [24, 20, 20]}, {"mrope_section": [16, 24, 24]}),
    ]


def test_the_dry_run_plans_it_and_a_launch_needs_only_the_checkpoint_and_gpus():
    problems = config_problems(["model=qwen2_5_vl_3b", *PLAN])
    assert "model.vision" not in problems and "model.hf_checkpoint" in problems, problems
    lines: list[str] = []
    assert dry_run(typed_config(["model=qwen2_5_vl_3b", *PLAN, "debug=dry_run"]), out=lines.append) == 0
    text = "\n".join(lines)
    assert "3.75B parameters" in text and "not built yet" not in text
    assert "is a vision-language model" in config_problems(["model=qwen2_5_vl_3b", "model.vision=null"])["model.vision"]
    text_model = dataclasses.replace(typed_config(["model=qwen3_4b"]).model, vision=VisionConfig(**TOWER))
    (problem,) = check_vision(text_model, vision_family=False)
    assert problem.key == "model.vision" and "is a text model" in problem.message
