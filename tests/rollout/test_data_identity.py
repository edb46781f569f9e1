"""A resume over a prompt file other than the one the checkpoint's cursor was saved with is exit 2 naming it, unless
checkpoint.allow_data_change=true (slime/rollout/data_identity.py); a real save writes the record:
tests/e2e/test_killed_save_resume.py."""

from __future__ import annotations

import json

import pytest

from slime.config import ConfigError
from slime.config.manifest import sha256_of
from slime.plan.validate import validate
from slime.rollout.data_identity import RECORD, prompt_identity, write_identity
from tests.helpers.compose import typed_config

ROWS = [{"prompt": f"what comes after {d} ?", "label": str((d + 1) % 10)} for d in range(10)]


@pytest.fixture
def saved(tmp_path):
    """(checkpoint root whose data source was saved over `prompts`, prompts)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    root = tmp_path / "ckpt"
    (root / "rollout").mkdir(parents=True)
    write_identity(root / "rollout", prompt_identity(str(prompts)))
    return root, prompts


def resume_problems(root, *overrides: str) -> dict[str, str]:
    cfg = typed_config(["data=prompt_file", "rollout.rm_type=exact_match", "checkpoint.resume=auto", *overrides])
    cfg.checkpoint.save = str(root)
    try:
        validate(cfg)
    except ConfigError as exc:
        return {p.key: str(p) for p in exc.problems}
    return {}


def test_the_record_is_the_spec_and_the_files_sha256(saved):
    root, prompts = saved
    assert json.loads((root / "rollout" / RECORD).read_text()) == {
        "prompt_data": str(prompts),
        "sha256": sha256_of(prompts),
    }
    assert resume_problems(root, f"data.prompt_data={prompts}") == {}


def test_a_changed_file_is_refused_naming_it_unless_allowed(saved):
    root, prompts = saved
    prompts.write_text(prompts.read_text().replace('"label": "1"', '"label": "7"'))
    found = resume_problems(root, f"data.prompt_data={prompts}")
    assert set(found) == {"data.prompt_data"}
    assert f"resuming from {root}: {prompts} changed since the checkpoint was saved" in found["data.prompt_data"]
    assert "set checkpoint.allow_data_change=true" in found["data.prompt_data"]
    assert resume_problems(root, f"data.prompt_data={prompts}", "checkpoint.allow_data_change=true") == {}


def test_another_file_or_row_slice_is_refused(saved, tmp_path):
    root, prompts = saved
    found = resume_problems(root, f"data.prompt_data='{prompts}@[0:5]'")
    assert f"the checkpoint's data source read {str(prompts)!r}" in found["data.prompt_data"]
    other = tmp_path / "other.jsonl"
    other.write_text(prompts.read_text())
    assert "data.prompt_data" in resume_problems(root, f"data.prompt_data={other}")


def test_a_fresh_run_and_a_root_without_a_record_are_not_checked(saved):
    root, prompts = saved
    prompts.write_text(prompts.read_text().replace('"label": "1"', '"label": "7"'))
    assert resume_problems(root, f"data.prompt_data={prompts}", "checkpoint.resume=null") == {}
    (root / "rollout" / RECORD).unlink()  # a checkpoint saved before records were written
    assert resume_problems(root, f"data.prompt_data={prompts}") == {}
