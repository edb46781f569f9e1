"""The agent of `recipe=tiny_agent`: plain `openai` client code, as a user writes it, run by the rollout through the
gateway (rollout.agent.entrypoint=slime.assets.lookup_agent:run; docs/agents.md).

Turn 1 offers the `number` tool; the tool's answer (the record's secret digit) then goes back as a tool message,
and turn 2 asks for the answer. The reward is the answer's: 0 unless the secret is the answer's first word; then
1.0 when turn 1 called the tool, 0.75 when it only began a call, 0.5 when it made none (the agent looked the number
up itself). Credit for calling comes with a right answer only, so it never rewards an answer turn that was wrong:
the model learns to read the tool's answer first, then to call the tool for the full reward.
"""

from __future__ import annotations

import httpx
from openai import AsyncOpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "number",
            "description": "the number the user asks for",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
CALL_TOKEN = "<tool_call>"


async def run(base_url: str, api_key: str, record: dict) -> float:
    # the gateway speaks plain HTTP: a client that loads no TLS certificates starts in 1 ms instead of 30
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=httpx.AsyncClient(verify=False))
    try:
        messages = list(record["prompt"])
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=2, logprobs=True
        )
        choice = reply.choices[0]
        began_call = bool(choice.logprobs.content) and choice.logprobs.content[0].token == CALL_TOKEN
        calls = [c for c in choice.message.tool_calls or [] if c.function.name == "number"]
        messages.append(choice.message.model_dump(exclude_none=True))
        call_id = calls[0].id if calls else "lookup"
        messages.append({"role": "tool", "tool_call_id": call_id, "content": str(record["metadata"]["secret"])})
        answer = await client.chat.completions.create(model="policy", messages=messages, max_tokens=1)
        words = (answer.choices[0].message.content or "").split()
        if words[:1] != [record["label"]]:
            return 0.0
        return 1.0 if calls else 0.75 if began_call else 0.5
    finally:
        await client.close()
