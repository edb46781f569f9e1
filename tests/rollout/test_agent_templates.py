"""The chat templates and tool-call parsers the gateway pairs, on real tokenizers: what a template renders for a
call, its parser reads back as the same call, and the re-rendering check passes the ids of a call written as the
template writes it and counts one written otherwise (SmolLM2-135M-Instruct with CHATML_TOOLS, as
recipe=smollm2_agent runs it; the tiny models' own template)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from slime.assets.chat_templates import CHATML_TOOLS
from slime.assets.tokenizer import build_tokenizer
from slime.rollout.agent.tool_calls import Qwen25Calls, TinyCalls
from slime.rollout.agent.trajectory import Template, TurnRecord, check_chat_turn

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
PLUS = {
    "type": "function",
    "function": {
        "name": "plus",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def call(name: str, arguments: dict) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def sampled_for(template: Template, messages, tools, reply) -> tuple[list[int], str]:
    """The ids (and text) the template renders for `reply` after the generation prompt: what a model that writes
    calls as its template does would have sampled."""
    prompt = template.render(messages, tools, generation_prompt=True)
    whole = template.render([*messages, reply], tools, generation_prompt=False)
    assert whole.startswith(prompt)
    ids = template.encode(whole)[len(template.encode(prompt)) :]
    return ids, whole[len(prompt) :]


@pytest.mark.parametrize("written_as_rendered", [True, False])
def test_smollm2_with_chatml_tools_round_trips_a_call(smollm2_dir, written_as_rendered):
    template = Template(AutoTokenizer.from_pretrained(smollm2_dir), CHATML_TOOLS)
    messages = [{"role": "user", "content": "What is 12 * 7?"}]
    reply = {"role": "assistant", "content": "", "tool_calls": [call("calculator", {"expression": "12 * 7"})]}
    sampled, text = sampled_for(template, messages, [CALCULATOR], reply)
    assert text.startswith('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>')
    if not written_as_rendered:  # the same call without JSON's spaces: parsed alike, rendered back otherwise
        text = text.replace('", "', '","').replace('": ', '":')
        sampled = template.encode(text)
    content, calls = Qwen25Calls().parse(text.removesuffix("<|im_end|>\n").removesuffix("<|im_end|>"), [CALCULATOR])
    assert content == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("calculator", {"expression": "12 * 7"})
    ]
    eos = template.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn = TurnRecord(prompt_length=0, sampled=sampled[: sampled.index(eos) + 1], weight_version="0",
                      finish_reason="stop", messages=messages, tools=[CALCULATOR])  # fmt: skip
    answered = {"role": "assistant", "content": content, "tool_calls": [call("calculator", {"expression": "12 * 7"})]}
    check_chat_turn(template, turn, answered)
    assert turn.mismatch is not written_as_rendered


def test_the_tiny_template_round_trips_a_call_with_values():
    template = Template(build_tokenizer())
    messages = [{"role": "user", "content": "what is 3 plus 4 ?"}]
    reply = {"role": "assistant", "content": "", "tool_calls": [call("plus", {"a": 3, "b": 4})]}
    sampled, text = sampled_for(template, messages, [PLUS], reply)
    assert template.tokenizer.convert_ids_to_tokens(sampled) == [
        "<tool_call>",
        "plus",
        "3",
        "4",
        "</tool_call>",
        "<|im_end|>",
    ]
    content, calls = TinyCalls().parse(template.tokenizer.decode(sampled[:-1], skip_special_tokens=False), [PLUS])
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"a": 3, "b": 4}
    turn = TurnRecord(prompt_length=0, sampled=sampled, weight_version="0", finish_reason="stop",
                      messages=messages, tools=[PLUS])  # fmt: skip
    check_chat_turn(template, turn, reply)
    assert turn.mismatch is False
