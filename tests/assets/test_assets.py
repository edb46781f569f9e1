"""Generated assets when several runs start at once (a sweep's jobs on one machine): each is made once and
never replaced under a run that is reading it."""

from __future__ import annotations

from pathlib import Path

from slime.assets.digit_task import write_dataset
from slime.assets.files import creation_lock
from slime.assets.prepare import prepare_assets
from slime.assets.tiny_model import create_tiny_model, ensure_tiny_model
from slime.config.schema import ModelConfig
from tests.helpers.compose import model_fields, typed_config
from tests.helpers.processes import in_thread, joined


def test_a_creator_that_waited_keeps_the_model_made_meanwhile(tmp_path):
    model = ModelConfig(**{**model_fields("tiny_qwen3"), "hf_checkpoint": str(tmp_path / "tiny_qwen3")})
    weights = Path(model.hf_checkpoint) / "model.safetensors"
    with creation_lock(model.hf_checkpoint):  # another run is creating it
        waiter, box = in_thread(lambda: ensure_tiny_model(model))
        waiter.join(0.5)
        assert waiter.is_alive() and not weights.exists()
        create_tiny_model(model)
        made = weights.stat()
    assert joined(waiter, box, 60) is False  # found the model under the lock: not made twice
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    assert ensure_tiny_model(model) is False


def test_runs_starting_together_create_each_asset_once(tmp_path):
    cfg = typed_config([f"paths.cache_dir={tmp_path / 'cache'}"])
    runs = [in_thread(lambda: prepare_assets(cfg)) for _ in range(3)]
    created = [joined(thread, box, 120) for thread, box in runs]
    assert sorted(p for paths in created for p in paths) == sorted([cfg.model.hf_checkpoint, cfg.data.prompt_data])
    generator = cfg.data.generator
    expected = write_dataset(tmp_path / "expected.jsonl", num_prompts=generator["num_prompts"], seed=generator["seed"])
    assert Path(cfg.data.prompt_data).read_text() == expected.read_text()
    assert prepare_assets(cfg) == []


def test_a_model_made_with_an_older_tokenizer_is_made_again_with_the_same_weights(tmp_path):
    """A cached tiny model whose saved chat template (or vocabulary) is not today's is not current: it is made again,
    and only its tokenizer changes (the weights are seeded by the model's config)."""
    model = ModelConfig(**{**model_fields("tiny_qwen3"), "hf_checkpoint": str(tmp_path / "tiny_qwen3")})
    assert ensure_tiny_model(model) is True
    saved = Path(model.hf_checkpoint)
    weights = (saved / "model.safetensors").read_bytes()
    template = saved / "chat_template.jinja"
    current = template.read_text()
    template.write_text(current.replace("<tool_call>", "<call>"))  # as made before the tool-call tokens
    assert ensure_tiny_model(model) is True
    assert template.read_text() == current and (saved / "model.safetensors").read_bytes() == weights
    assert ensure_tiny_model(model) is False
