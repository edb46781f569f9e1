"""An offline word-level tokenizer with a Qwen-style chat template, built from code.

The embedded default cannot download a tokenizer, so it builds one: a `tokenizers` WordLevel model
over a fixed vocabulary (special tokens, chat roles, digits, letters, a few words and punctuation),
wrapped as a `PreTrainedTokenizerFast` and saved with `save_pretrained`. The vocabulary order is
fixed, so the same ids come out on every machine.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, UNK_TOKEN]
# Qwen's tool-call markers, last in the vocabulary (ids 76-79 of the tiny models' 80), so adding them changed no
# earlier token's id and no model's shape
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
TOOL_TOKENS = [TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END]

_WORDS = [
    "system",
    "user",
    "assistant",
    "you",
    "are",
    "a",
    "helpful",
    "what",
    "comes",
    "after",
    "before",
    "next",
    "is",
    "the",
    "answer",
    "number",
    "digit",
    "letter",
    "of",
    "plus",
    "minus",
    "reply",
    "with",
]
_PUNCT = list("?:.,+-=()!'\"/*")

# Qwen's ChatML layout: each turn is `<|im_start|>role\ncontent<|im_end|>\n`. With `tools`, a system turn names
# them; an assistant's tool call is `<tool_call> name value ... </tool_call>` (its arguments' values in order, words
# this vocabulary can spell: the tiny models' form of Qwen's JSON call, read by slime.rollout.agent.tool_calls
# "tiny"), and a tool's answer is a user turn `<tool_response> content </tool_response>`, as Qwen2.5's template has.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% for tool in tools %}{{ (tool.function or tool).name + ' ' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response> ' + message['content'] + ' </tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '<tool_call> ' + call.function.name }}"
    "{% for value in (call.function.arguments or {}).values() %}{{ ' ' + value | string }}{% endfor %}"
    "{{ ' </tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vocabulary() -> list[str]:
    """The ordered vocabulary: special tokens first, then words, digits, letters, punctuation."""
    seen: dict[str, None] = {}
    for token in SPECIAL_TOKENS + _WORDS + list(string.digits) + list(string.ascii_lowercase) + _PUNCT + TOOL_TOKENS:
        seen.setdefault(token, None)
    return list(seen)


def build_tokenizer(save_dir: str | Path | None = None):
    """Build the word-level tokenizer; save it to `save_dir` when given. Returns the HF tokenizer."""
    vocab = {token: i for i, token in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        additional_special_tokens=[IM_START, *TOOL_TOKENS],
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer
