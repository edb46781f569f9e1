"""OpenAI's chat-completions and completions API as the gateway speaks it: which request fields a turn takes,
what it refuses (with why), and the response bodies and stream chunks.

The run decides how the policy samples: `rollout.temperature`, `top_p` and `top_k` hold for every turn, so the
trained log-probs are the sampled distribution's. A request may leave them out or repeat the run's values; any
other value is refused (400), as are fields that would change sampling unseen (`n` > 1, penalties, `logit_bias`,
`response_format`, `tool_choice` other than "auto" or "none", `top_logprobs`). `max_tokens` (or
`max_completion_tokens`) caps the turn within what is left of the episode's `rollout.max_response_len`; `stop`
adds stop strings; `model` is not checked (the gateway serves the policy only).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any


class RequestError(ValueError):
    """A request the gateway refuses: HTTP `status` and a message that says why and what to send instead."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(kw_only=True)
class TurnRequest:
    """One request, checked: the conversation (chat) or the prompt (completions), and how to sample."""

    kind: str  # "chat" | "completion"
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    stream: bool = False
    logprobs: bool = False
    include_usage: bool = False
    model: str = "policy"


_ZERO_DEFAULTS = {"presence_penalty": 0, "frequency_penalty": 0}


def parse_request(body: Any, kind: str, sampling: dict[str, Any]) -> TurnRequest:
    """Check a request body against the run's sampling params `sampling` (SGLang's: temperature, top_p, top_k)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for key, run_key in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        if body.get(key) is not None and float(body[key]) != float(sampling.get(run_key, body[key])):
            raise RequestError(
                f"{key}={body[key]} differs from the run's rollout.{run_key}={sampling.get(run_key)}: the policy is "
                f"trained on the distribution the run samples; leave {key} out of the request, or set rollout.{run_key}"
            )
    for key, zero in _ZERO_DEFAULTS.items():
        if body.get(key) not in (None, zero):
            raise RequestError(f"{key} is not supported by the training gateway (it would change sampling unseen)")
    if body.get("n") not in (None, 1):
        raise RequestError("n > 1 is not supported: run one request per completion (each is its own turn)")
    for key in ("logit_bias", "response_format"):
        if body.get(key):
            raise RequestError(f"{key} is not supported by the training gateway")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise RequestError('tool_choice: only "auto" and "none" are supported (the model decides whether to call)')
    if body.get("top_logprobs"):
        raise RequestError("top_logprobs is not supported: logprobs=true returns each sampled token's log-prob")
    stop = body.get("stop") or []
    request = TurnRequest(
        kind=kind,
        max_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
        stop=[stop] if isinstance(stop, str) else list(stop),
        stream=bool(body.get("stream")),
        logprobs=bool(body.get("logprobs")),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        model=str(body.get("model") or "policy"),
    )
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages: a non-empty list of chat messages is required")
        request.messages = [normalized_message(m, i) for i, m in enumerate(messages)]
        request.tools = body.get("tools") or None if body.get("tool_choice") != "none" else None
    else:
        prompt = body.get("prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise RequestError("prompt: one string or one list of token ids is required")
        request.prompt = prompt
    if request.max_tokens is not None and (not isinstance(request.max_tokens, int) or request.max_tokens < 1):
        raise RequestError(f"max_tokens must be a positive integer, got {request.max_tokens!r}")
    return request


def normalized_message(message: Any, index: int) -> dict[str, Any]:
    """The fields of a chat message the template reads (role, content, tool_calls with arguments as objects,
    tool_call_id, name); None, "" and a missing field are the same, and a client's extra fields are dropped."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"messages[{index}] must be an object with a role")
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text only
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    out: dict[str, Any] = {"role": message["role"], "content": content or ""}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [_call_object(c, index) for c in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def _call_object(call: Any, index: int) -> dict[str, Any]:
    """A tool call with its arguments parsed (HF chat templates render an object; OpenAI sends a JSON string)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not function.get("name"):
        raise RequestError(f"messages[{index}].tool_calls: each call needs function.name")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise RequestError(f"messages[{index}].tool_calls: arguments are not JSON ({exc})") from exc
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


# ---- responses -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class TurnResult:
    """What one turn produced, for its response: the text, the calls, each sampled token and its log-prob."""

    content: str
    tool_calls: list[dict[str, Any]]
    tokens: list[str]  # each sampled token's text
    log_probs: list[float]
    finish_reason: str  # OpenAI's: stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int
    weight_version: str


def _usage(result: TurnResult) -> dict[str, int]:
    total = result.prompt_tokens + result.completion_tokens
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens, "total_tokens": total}


def _chat_logprobs(result: TurnResult) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(result.tokens, result.log_probs)
        ]
    }


def chat_response(request: TurnRequest, result: TurnResult) -> dict[str, Any]:
    """A `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content or None}
    if result.tool_calls:
        message["tool_calls"] = result.tool_calls
    choice = {"index": 0, "message": message, "finish_reason": result.finish_reason, "logprobs": None}
    if request.logprobs:
        choice["logprobs"] = _chat_logprobs(result)
    return {**_head("chat.completion", request), "choices": [choice], "usage": _usage(result),
            "metadata": {"weight_version": result.weight_version}}  # fmt: skip


def completion_response(request: TurnRequest, result: TurnResult) -> dict[str, Any]:
    """A `text_completion` object."""
    choice = {"index": 0, "text": result.content, "finish_reason": result.finish_reason, "logprobs": None}
    if request.logprobs:
        choice["logprobs"] = {"tokens": result.tokens, "token_logprobs": result.log_probs, "top_logprobs": None}
    return {**_head("text_completion", request), "choices": [choice], "usage": _usage(result)}


def stream_chunks(request: TurnRequest, result: TurnResult) -> list[dict[str, Any]]:
    """The stream of a finished turn: a chunk per sampled token's text (the tool calls in one chunk), the finish
    chunk, and the usage chunk when `stream_options.include_usage` asked for it."""
    if request.kind == "completion":
        head = _head("text_completion", request)
        chunks = [
            {**head, "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}]}
            for text in _pieces(request, result)
        ]
        chunks.append({**head, "choices": [{"index": 0, "text": "", "finish_reason": result.finish_reason}]})
    else:
        head = _head("chat.completion.chunk", request)
        chunks = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        ]
        for text in _pieces(request, result):
            chunks.append({**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        if result.tool_calls:
            calls = [{"index": i, **c} for i, c in enumerate(result.tool_calls)]
            chunks.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
        chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": result.finish_reason}]})
    if request.include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(result)})
    return chunks


def _pieces(request: TurnRequest, result: TurnResult) -> list[str]:
    """The content in one piece (a turn is generated whole, then streamed)."""
    return [result.content] if result.content else []


def _head(kind: str, request: TurnRequest) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": request.model}
