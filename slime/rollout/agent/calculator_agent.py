"""The agent of `recipe=smollm2_agent`: plain `openai` client code with a calculator tool for the arithmetic word
problems (slime.assets.arithmetic_task). The model may call `calculator` with an expression (evaluated by
slime.rollout.tool_use.calculate, in its own process with a time limit) as often as the run's
`rollout.agent.max_turns` leaves room, then answers; the run's reward (rm_type=math) grades the answer's
\\boxed{}. Tool calls go through the model's chat template (slime.assets.chat_templates.CHATML_TOOLS for SmolLM2).
"""

from __future__ import annotations

import json

import httpx
from openai import AsyncOpenAI

from slime.rollout.tool_use import calculate

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression of numbers, + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example 12 * (3 + 4)"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 3  # recipes/smollm2_agent.yaml: rollout.agent.max_turns
TURN_TOKENS = 96


async def run(base_url: str, api_key: str, record: dict) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=httpx.AsyncClient(verify=False))
    try:
        messages = list(record["prompt"])
        for turn in range(MAX_TURNS):
            tools = TOOLS if turn < MAX_TURNS - 1 else None  # the last turn answers
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=tools, max_tokens=TURN_TOKENS
            )
            message = reply.choices[0].message
            if not message.tool_calls or reply.choices[0].finish_reason == "length":
                return None  # answered (or out of budget): rm_type=math grades the response
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": await calculate(str(expression))})
        return None
    finally:
        await client.close()
