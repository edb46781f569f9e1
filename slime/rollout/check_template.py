"""The chat template a run's prompts are rendered with: a tokenizer without one, where the data needs one, stops the
run before anything starts (exit 2) instead of failing in the rollout manager at start-up.

Read from the checkpoint's files, as transformers' tokenizer loading finds a template (tokenization_utils_base
`PreTrainedTokenizerBase.from_pretrained`): the `chat_template` entry of tokenizer_config.json, the file
chat_template.jinja, or named templates under additional_chat_templates/. No tokenizer is loaded here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.registry import ROLLOUT_FUNCTIONS
from slime.rollout.entry_points import rollout_function_path

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG = "tokenizer_config.json"


def has_chat_template(checkpoint: Path) -> bool:
    """True when the tokenizer files in the directory `checkpoint` carry a chat template."""
    if (checkpoint / TEMPLATE_FILE).is_file():
        return True
    template_dir = checkpoint / TEMPLATE_DIR
    if template_dir.is_dir() and any(template_dir.glob("*.jinja")):
        return True
    try:
        config = json.loads((checkpoint / TOKENIZER_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def template_need(cfg: RunConfig) -> Optional[tuple[str, object, str]]:
    """(key, value, what the template renders) when the run renders prompts with the chat template, else None."""
    if cfg.debug.load_rollout_data is not None:
        return None  # a replay trains from dumped samples: no prompt is rendered
    if rollout_function_path(cfg) == ROLLOUT_FUNCTIONS.target("sft"):
        return "rollout.function", cfg.rollout.function or "sft", "SFT renders each conversation with it"
    if cfg.data.apply_chat_template:
        return "data.apply_chat_template", True, "each prompt becomes a user message rendered with it"
    return None


def check_chat_template(cfg: RunConfig) -> Iterator[Problem]:
    """A Problem when the prompts need a chat template and the tokenizer at model.hf_checkpoint has none. A
    checkpoint that is not a local directory yet (one the run generates, checked again once it exists), or holds
    no tokenizer config (its tokenizer's loading reports that), passes."""
    need = template_need(cfg)
    checkpoint = Path(cfg.model.hf_checkpoint).expanduser()
    if need is None or not (checkpoint / TOKENIZER_CONFIG).is_file() or has_chat_template(checkpoint):
        return
    key, value, renders = need
    fix = (
        "set data.apply_chat_template=false to send the prompts as plain text, or point model.hf_checkpoint at a "
        f"checkpoint whose tokenizer has a chat template ({TEMPLATE_FILE} beside tokenizer.json)"
    )
    if key == "rollout.function":
        fix = f"give model.hf_checkpoint a tokenizer with a chat template ({TEMPLATE_FILE} beside tokenizer.json)"
    yield Problem(
        key,
        value,
        f"the tokenizer at {checkpoint} has no chat template (no {TEMPLATE_FILE}, none in tokenizer_config.json), "
        f"and {renders}",
        fix,
    )
