"""What the tiny models' tokenizer is, in plain Python (no tokenizers, no transformers): its vocabulary in id order
and its chat template. slime.assets.tokenizer builds the tokenizer from it; slime.assets.made checks a generated
model's saved tokenizer against it without importing either library.
"""

from __future__ import annotations

import string

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
# A vision-language model's tokens (Qwen2.5-VL's): an image in a prompt is `<|vision_start|><|image_pad|>
# <|vision_end|>`, its processor repeating the pad once per image token. Only the tiny vision model's vocabulary
# has them, after everything else, with the words of its visual task.
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
_VISION_WORDS = ["how", "many", "red", "green", "blue", "square", "squares", "shapes", "colour", "in", "image"]

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
# The assistant's turn after a tool's answer opens with the word "answer" (its generation prompt too), as Qwen3's
# template opens a turn with `<think>`: a turn that answers is told apart from one that calls.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% for tool in tools %}{{ (tool.function or tool).name + ' ' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response> ' + message['content'] + ' </tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{% set opening = 'answer ' if message['role'] == 'assistant' and not loop.first"
    " and loop.previtem['role'] == 'tool' else '' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + opening + (message['content'] or '') }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '<tool_call> ' + call.function.name }}"
    "{% for value in (call.function.arguments or {}).values() %}{{ ' ' + value | string }}{% endfor %}"
    "{{ ' </tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if messages and messages[-1]['role'] == 'tool' %}{{ 'answer ' }}{% endif %}{% endif %}"
)


# A message's content as a vision-language template renders it: a string as is, a list of parts in order (an image
# part as its placeholder, a text part as its text), as Qwen2.5-VL's template does.
_CONTENT = "{{ '<|im_start|>' + message['role'] + '\n' + opening + (message['content'] or '') }}"
_VISION_CONTENT = (
    "{{ '<|im_start|>' + message['role'] + '\n' + opening }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] or [] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)
VISION_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(_CONTENT, _VISION_CONTENT)


def vocabulary(*, vision: bool = False) -> list[str]:
    """The ordered vocabulary: special tokens first, then words, digits, letters, punctuation, tool markers (and,
    for the tiny vision model, its tokens and words)."""
    seen: dict[str, None] = {}
    tokens = SPECIAL_TOKENS + _WORDS + list(string.digits) + list(string.ascii_lowercase) + _PUNCT + TOOL_TOKENS
    for token in tokens + (VISION_TOKENS + _VISION_WORDS if vision else []):
        seen.setdefault(token, None)
    return list(seen)


def chat_template(*, vision: bool = False) -> str:
    """The tiny models' chat template; a vision model's renders image parts of a message's content."""
    return VISION_CHAT_TEMPLATE if vision else CHAT_TEMPLATE
