"""A tokenizer without a chat template, where the prompts need one, stops the run before anything starts (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from slime.rollout.check_template import has_chat_template
from tests.helpers.runs import assert_stopped_in_validation, run_main
from tests.helpers.validation import problems_for


@pytest.fixture
def untemplated(tiny_model_dir, tmp_path) -> Path:
    """The embedded tiny model with its tokenizer's chat template removed."""
    checkpoint = tmp_path / "untemplated"
    shutil.copytree(tiny_model_dir, checkpoint)
    (checkpoint / "chat_template.jinja").unlink()
    return checkpoint


def test_the_template_is_found_where_transformers_finds_it(untemplated):
    assert not has_chat_template(untemplated)
    assert AutoTokenizer.from_pretrained(untemplated).chat_template is None
    config_file = untemplated / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "chat_template": "{{ messages[0]['content'] }}"}))
    assert has_chat_template(untemplated)
    assert AutoTokenizer.from_pretrained(untemplated).chat_template == "{{ messages[0]['content'] }}"
    config_file.write_text(json.dumps(config))
    (untemplated / "additional_chat_templates").mkdir()
    (untemplated / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    assert has_chat_template(untemplated)
    assert set(AutoTokenizer.from_pretrained(untemplated).chat_template) == {"tool_use"}


def test_prompts_rendered_with_a_missing_template_are_refused_naming_the_key_and_the_checkpoint(untemplated, tmp_path):
    found = problems_for([f"model.hf_checkpoint={untemplated}"], tmp_path / "run")
    assert set(found) == {"data.apply_chat_template"}
    assert f"the tokenizer at {untemplated} has no chat template" in found["data.apply_chat_template"]
    assert "set data.apply_chat_template=false" in found["data.apply_chat_template"]
    sft = problems_for([f"model.hf_checkpoint={untemplated}", "algo=sft"], tmp_path / "run")
    assert "rollout.function" in sft and "SFT renders each conversation" in sft["rollout.function"]


def test_plain_text_prompts_need_no_template(untemplated, tmp_path):
    from slime.plan.validate import validate
    from tests.helpers.compose import typed_config

    validate(typed_config([f"model.hf_checkpoint={untemplated}", "data.apply_chat_template=false"], str(tmp_path)))


def test_the_cli_exits_2_before_anything_starts(untemplated, tmp_path):
    run_dir = tmp_path / "run"
    proc, imported = run_main(f"hydra.run.dir={run_dir}", f"model.hf_checkpoint={untemplated}")
    assert_stopped_in_validation(proc, imported)
    assert "data.apply_chat_template=True: the tokenizer at" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "logs").exists()  # no Ray, no rollout manager
