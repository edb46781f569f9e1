"""The real config tree as a test composes it: the checkout's paths, composed and typed configs, the options of
every group, a model option's fields and a fake HF download matching them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from slime.config import to_run_config
from slime.config.schema_vision import VisionConfig
from slime.run_schema import register_configs

ROOT = Path(__file__).resolve().parents[2]  # the checkout
CONF = ROOT / "conf"
# Rank-8 adapters synced alone (the engines serve them as a LoRA adapter), the final norm's trained gain riding along
LORA_ALONE = ("model.lora.rank=8", "model.lora.train_params=[model.norm.weight]", "model.lora.sync_merged=false")
# The same adapters and gain, the engines getting the merged weights
LORA_MERGED = ("model.lora.rank=8", "model.lora.train_params=[model.norm.weight]", "model.lora.sync_merged=true")


def compose_config(overrides: list[str], output_dir: str = "/tmp/slime-test-run"):
    """Compose conf/config.yaml with `overrides` (as the CLI would) and return the DictConfig."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[f"paths.output_dir={output_dir}", *overrides])


def group_choices(overrides: list[str]) -> dict[str, str | None]:
    """{group: option} of the config composed with `overrides` (Hydra's runtime choices: `model@teacher` keys
    included, Hydra's own groups left out)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra")}


def typed_config(overrides: list[str], output_dir: str = "/tmp/slime-test-run"):
    return to_run_config(compose_config(overrides, output_dir))


def group_options() -> list[tuple[str, str]]:
    """(group, option) for every YAML option file of every top-level config group, recipes and presets included
    (conf/preset's subfolders hold values presets include, no options of their own)."""
    pairs = []
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir()):
        for option in sorted(group_dir.glob("*.yaml")):
            pairs.append((group_dir.name, option.stem))
    return pairs


def model_fields(option: str) -> dict:
    """The ModelConfig fields of conf/model/<option>.yaml (a model option holds nothing else); a vision tower's as
    the VisionConfig its schema holds."""
    fields = yaml.safe_load((CONF / "model" / f"{option}.yaml").read_text())
    if fields.get("vision"):
        fields["vision"] = VisionConfig(**fields["vision"])
    return fields


def fake_hf_dir(tmp_path, model_option: str):
    """A directory whose config.json matches conf/model/<option>.yaml (what a real download has)."""
    # Imported here, as before this moved out of test_config.py: tests/conftest.py imports this module, and the
    # tiny-model code would bring transformers into every test session at start-up.
    from slime.assets.tiny_model import hf_config_dict
    from slime.config.schema import ModelConfig

    fields = model_fields(model_option)
    fields["hf_checkpoint"] = str(tmp_path / model_option)
    (tmp_path / model_option).mkdir()
    (tmp_path / model_option / "config.json").write_text(
        json.dumps(hf_config_dict(ModelConfig(**fields), eos_token_id=0, pad_token_id=0))
    )
    return fields["hf_checkpoint"]
