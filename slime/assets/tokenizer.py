"""An offline word-level tokenizer with a Qwen-style chat template, built from code.

The embedded default cannot download a tokenizer, so it builds one: a `tokenizers` WordLevel model
over a fixed vocabulary (special tokens, chat roles, digits, letters, a few words and punctuation),
wrapped as a `PreTrainedTokenizerFast` and saved with `save_pretrained`. The vocabulary order is
fixed, so the same ids come out on every machine.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from slime.assets.tokenizer_spec import (  # noqa: F401  (re-exported: the tokenizer's parts in one place)
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    IMAGE_PAD,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    TOOL_TOKENS,
    UNK_TOKEN,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
    chat_template,
    vocabulary,
)


def build_tokenizer(save_dir: str | Path | None = None, *, vision: bool = False):
    """Build the word-level tokenizer (a vision model's: with its image tokens, words and template); save it to
    `save_dir` when given. Returns the HF tokenizer."""
    vocab = {token: i for i, token in enumerate(vocabulary(vision=vision))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        additional_special_tokens=[IM_START, *TOOL_TOKENS, *(VISION_TOKENS if vision else [])],
        padding_side="left",
        chat_template=chat_template(vision=vision),
        model_max_length=4096,
    )
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer
