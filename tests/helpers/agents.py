"""Agents for the gateway's tests: plain `openai` client code, as a user writes it (slime.rollout.agent.episode
calls each as fn(base_url, api_key, record))."""

from __future__ import annotations

import time

from openai import OpenAI

FOLLOW_UP = {"role": "user", "content": "what comes next ?"}


def client(base_url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def chat_three_turns(base_url: str, api_key: str, record: dict) -> dict:
    """Three chat turns (the second streamed), each answer sent back as the next request's history; logprobs on.
    Reward (a dict, rollout.reward_key "reward"): the number of characters answered, and under "seen" the replies
    and log-probs it saw, for the test."""
    openai = client(base_url, api_key)
    messages = list(record["prompt"])
    seen = []
    for turn in range(3):
        if turn == 1:
            stream = openai.chat.completions.create(
                model="policy", messages=messages, max_tokens=6, logprobs=True, stream=True
            )
            content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            seen.append({"content": content, "logprobs": None})
        else:
            reply = openai.chat.completions.create(model="policy", messages=messages, max_tokens=6, logprobs=True)
            choice = reply.choices[0]
            content = choice.message.content or ""
            seen.append({"content": content, "logprobs": [t.logprob for t in choice.logprobs.content]})
        messages += [{"role": "assistant", "content": content}, FOLLOW_UP]
    return {"reward": float(len("".join(s["content"] for s in seen))), "seen": seen}


def completions_two_turns(base_url: str, api_key: str, record: dict) -> None:
    """A text prompt, then the prompt, the answer and more text; then the ids so far and more ids. No reward:
    the run's reward model scores it."""
    openai = client(base_url, api_key)
    prompt = "<|im_start|>user\nwhat comes after 3 ?<|im_end|>\n<|im_start|>assistant\n"
    first = openai.completions.create(model="policy", prompt=prompt, max_tokens=4)
    prompt = prompt + first.choices[0].text + " next "
    openai.completions.create(model="policy", prompt=prompt, max_tokens=4)
    return None


def raises_in_one_of_ten(base_url: str, api_key: str, record: dict) -> float:
    """One chat turn, then raises for every tenth prompt (labels 0, 10, ...: "Count to i." has label i)."""
    openai = client(base_url, api_key)
    reply = openai.chat.completions.create(model="policy", messages=list(record["prompt"]), max_tokens=4)
    if int(record["label"]) % 10 == 0:
        raise RuntimeError("the agent's tool crashed")
    return float(bool(reply.choices[0].message.content))


def sleeps(base_url: str, api_key: str, record: dict) -> float:
    """Outlives any timeout a test gives (the rollout must not wait for it)."""
    time.sleep(60)
    return 1.0


def no_request(base_url: str, api_key: str, record: dict) -> float:
    return 1.0
