"""How a turn's sampled text becomes OpenAI `tool_calls`: one parser per chat-template format, chosen by
`rollout.agent.tool_parser` (slime.registry.TOOL_PARSERS).

A parser's `parse(text, tools)` returns the assistant's content (the text outside the calls, stripped) and its
calls as OpenAI's `tool_calls` entries (`{"id", "type": "function", "function": {"name", "arguments": json}}`).
A call that does not parse (bad JSON, an unknown tool, a wrong number of values) stays in the content: the agent
sees what the model wrote, and no call is invented.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)  # the last call may end with the turn


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI `tool_calls` entry (arguments serialised as JSON, as OpenAI's API sends them)."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _split(text: str, parse_one, pattern: re.Pattern = _CALL) -> tuple[str, list[dict[str, Any]]]:
    """Content outside the `<tool_call>` blocks that parse, and their calls in order."""
    calls, content, last = [], [], 0
    for match in pattern.finditer(text):
        call = parse_one(match.group(1))
        if call is None:
            continue
        content.append(text[last : match.start()])
        calls.append(call)
        last = match.end()
    content.append(text[last:])
    # the text around calls loses the whitespace the template puts there; a turn without a call keeps its text
    # exactly, so that sent back it renders to the sampled ids
    return ("".join(content).strip(), calls) if calls else (text, calls)


def _tool_names(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {t.get("function", t)["name"]: t.get("function", t) for t in tools or []}


class Qwen25Calls:
    """Qwen2.5's form (also SmolLM2's and Hermes'): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
    as SGLang's `Qwen25Detector` reads it (sglang/srt/function_call/qwen25_detector.py: a JSON object per block,
    `arguments` or `parameters`)."""

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
        known = _tool_names(tools)

        def one(body: str) -> dict[str, Any] | None:
            try:
                obj = json.loads(body.strip())
            except json.JSONDecodeError:
                return None
            if not isinstance(obj, dict) or obj.get("name") not in known:
                return None
            arguments = obj.get("arguments", obj.get("parameters", {}))
            return tool_call(obj["name"], arguments) if isinstance(arguments, dict) else None

        return _split(text, one)


class TinyCalls:
    """The tiny models' form (slime.assets.tokenizer.CHAT_TEMPLATE, a word-level vocabulary that spells no JSON):
    `<tool_call> name value ... </tool_call>`, the values of the tool's parameters in the order its schema lists
    them; "integer" and "number" parameters are read as numbers. A turn may end inside its last call (cut by
    `max_tokens` or a stop right after the values): the turn's end closes it, as the template's rendering of the
    call then continues the sampled ids."""

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
        known = _tool_names(tools)

        def one(body: str) -> dict[str, Any] | None:
            words = body.split()
            if not words or words[0] not in known:
                return None
            properties = known[words[0]].get("parameters", {}).get("properties", {})
            if len(words) - 1 != len(properties):
                return None
            arguments = {}
            for (key, schema), word in zip(properties.items(), words[1:]):
                value = _number(word, schema.get("type"))
                if value is None:
                    return None
                arguments[key] = value
            return tool_call(words[0], arguments)

        return _split(text, one, _OPEN_CALL)


def _number(word: str, kind: str | None) -> Any:
    """`word` as the schema's type: int for "integer", float for "number", else the word; None if it is not one."""
    try:
        return int(word) if kind == "integer" else float(word) if kind == "number" else word
    except ValueError:
        return None
