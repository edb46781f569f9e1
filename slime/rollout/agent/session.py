"""One episode's token stream. The first request's prompt is rendered and tokenized once; every later turn's
prompt is the episode's ids so far (the earlier prompts and exactly the ids the engine sampled), then the ids the
template puts after the last reply, then the newly rendered suffix (the tool results or user turn). Nothing sampled
is ever tokenized again; the re-rendering serves the check (slime.rollout.agent.trajectory) only.

The episode is the generate function's `Sample`: its tokens are the first prompt then the response, in which the
engine's ids carry loss mask 1 and their log-probs and weight versions, and every id the gateway added carries
loss mask 0 (as a tool's output in docs/architecture.md#alignment-invariants).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from slime.rollout.agent.openai_api import RequestError, TurnRequest, TurnResult
from slime.rollout.agent.trajectory import Template, TurnRecord, check_chat_turn, check_completion_turn
from slime.rollout.generate import append_engine_output
from slime.types import Sample, SampleStatus

EngineCall = Callable[[Sample, dict[str, Any]], Awaitable[dict | None]]


class EpisodeSession:
    """The turns of one episode, building `sample` (fresh: no tokens) as they come.

    Args:
        sample: the episode's sample.
        template: the policy's tokenizer and the chat template that renders the conversation.
        sampling_params: the run's SGLang sampling params; `max_new_tokens` is the whole episode's budget (tokens
            after the first prompt: sampled ids and added ones).
        tool_parser: reads a turn's text into tool calls (slime.rollout.agent.tool_calls).
        max_turns: engine turns the episode may take.
    """

    def __init__(
        self, sample: Sample, *, template: Template, sampling_params: dict[str, Any], tool_parser: Any, max_turns: int
    ):
        self.sample = sample
        self.template = template
        self.tokenizer = tokenizer = template.tokenizer
        self.sampling_params = sampling_params
        self.tool_parser = tool_parser
        self.max_turns = max_turns
        self.turns: list[TurnRecord] = []
        stop_ids = [tokenizer.eos_token_id, *sampling_params.get("stop_token_ids", [])]
        self.stop_ids = {i for i in stop_ids if i is not None}

    # ---- one turn ----------------------------------------------------------------------------------------
    async def turn(self, request: TurnRequest, engine: EngineCall) -> TurnResult:
        """Extend the episode by `request`'s new part, sample the turn (`engine` posts /generate continuing the
        sample), record it. Raises RequestError for a request that does not continue the episode."""
        if len(self.turns) >= self.max_turns:
            raise RequestError(f"the episode has taken its rollout.agent.max_turns={self.max_turns} turns")
        budget = self.sampling_params["max_new_tokens"]
        if not self._extend(request, budget):
            return self._no_budget(request)
        sample, start = self.sample, self.sample.response_length
        prompt_length = len(sample.tokens)
        cap = min(budget, start + (request.max_tokens or budget))
        params = {**self.sampling_params, "max_new_tokens": cap}
        if request.stop:
            params["stop"] = [*params.get("stop", []), *request.stop]
        out = await engine(sample, params)
        while out is not None:
            append_engine_output(sample, out)
            if sample.status != SampleStatus.ABORTED:
                break
            out = await engine(sample, params)  # a weight push cut the turn: it continues under the new weights
        sampled = sample.tokens[prompt_length:]
        record = TurnRecord(
            prompt_length=prompt_length,
            sampled=sampled,
            weight_version=sample.weight_versions[-1] if sample.weight_versions else "",
            finish_reason={SampleStatus.TRUNCATED: "length"}.get(sample.status, "stop"),
            messages=request.messages,
            tools=request.tools,
            prompt=request.prompt if isinstance(request.prompt, str) else None,
        )
        self.turns.append(record)
        return self._result(request, record, sample.rollout_log_probs[start:])

    def _result(self, request: TurnRequest, record: TurnRecord, log_probs: list[float]) -> TurnResult:
        ids = record.sampled[:-1] if record.sampled and record.sampled[-1] in self.stop_ids else record.sampled
        # special tokens stay in the text (only the final stop token is left out): a reply sent back renders to the
        # ids that were sampled, where dropping them would make the turn a mismatch the model never made
        content, calls = self.tokenizer.decode(ids, skip_special_tokens=False), []
        if request.kind == "chat" and request.tools:
            content, calls = self.tool_parser.parse(content, request.tools)
        if request.kind == "chat":
            record.reply = {"role": "assistant", "content": content}
            if calls:
                record.reply["tool_calls"] = [_with_object_arguments(c) for c in calls]
        else:
            record.text = content
        finish = "tool_calls" if calls else record.finish_reason
        return TurnResult(
            content=content,
            tool_calls=calls,
            tokens=[self.tokenizer.decode([i]) for i in record.sampled],
            log_probs=list(log_probs),
            finish_reason=finish,
            prompt_tokens=record.prompt_length,
            completion_tokens=len(record.sampled),
            weight_version=record.weight_version,
        )

    def _no_budget(self, request: TurnRequest) -> TurnResult:
        """The episode's response budget is spent: the turn ends at once with finish_reason "length"."""
        self.sample.status = SampleStatus.TRUNCATED
        return TurnResult(content="", tool_calls=[], tokens=[], log_probs=[], finish_reason="length",
                          prompt_tokens=len(self.sample.tokens), completion_tokens=0,
                          weight_version=self.sample.weight_versions[-1] if self.sample.weight_versions else "")  # fmt: skip

    # ---- the prompt ----------------------------------------------------------------------------------------
    def _extend(self, request: TurnRequest, budget: int) -> bool:
        """Put the request's new part after the episode's ids (the first request: its whole prompt). False when
        the budget cannot hold it (nothing appended)."""
        if not self.turns:
            self._first_prompt(request)
            return True
        added = self._chat_suffix(request) if request.kind == "chat" else self._completion_suffix(request)
        if self.sample.response_length + len(added) >= budget:
            return False
        self.sample.append_response(added, [0.0] * len(added), self.tokenizer.decode(added), loss_mask_value=0)
        return True

    def _first_prompt(self, request: TurnRequest) -> None:
        if request.kind == "chat":
            text = self._render(request.messages, request.tools, generation_prompt=True)
            ids = self.template.encode(text)
        elif isinstance(request.prompt, str):
            text, ids = request.prompt, self.template.encode(request.prompt)
        else:
            ids = list(request.prompt)
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        self.sample.prompt, self.sample.tokens = text, ids

    def _chat_suffix(self, request: TurnRequest) -> list[int]:
        """The ids after the episode's: the previous turn's end separator, then the new messages rendered."""
        last = self.turns[-1]
        if last.messages is None:
            raise RequestError("this session's earlier turns were completions; a chat request opens its own session")
        n = len(last.messages)
        if request.messages[:n] != last.messages or len(request.messages) <= n + 1:
            raise RequestError(
                f"the messages do not continue this session's conversation: they must repeat the {n} messages of "
                "its last request, then its assistant reply, then the new messages (open a new session for "
                "another conversation)", status=409)  # fmt: skip
        if request.messages[n]["role"] != "assistant":
            raise RequestError(f"messages[{n}] must be the assistant's reply to the session's last request")
        separator = check_chat_turn(self.template, last, request.messages[n])
        history = self._render(request.messages[: n + 1], request.tools, generation_prompt=False)
        new = self._render(request.messages, request.tools, generation_prompt=True)
        if not new.startswith(history):  # a template that renders earlier turns otherwise once more follow
            last.mismatch = True
        return separator + self.template.encode(new[_common_prefix(new, history) :])

    def _completion_suffix(self, request: TurnRequest) -> list[int]:
        last = self.turns[-1]
        if last.messages is not None:
            raise RequestError("this session's earlier turns were chat completions; a completion opens its own session")
        tokens = self.sample.tokens
        if isinstance(request.prompt, list):
            if request.prompt[: len(tokens)] != tokens:
                raise RequestError("the prompt's token ids do not begin with this session's ids so far", status=409)
            check_completion_turn(self.template, last, self.stop_ids) if last.prompt is not None else None
            return request.prompt[len(tokens) :]
        before = (last.prompt or "") + last.text
        if last.prompt is None or not request.prompt.startswith(before):
            raise RequestError(
                "the prompt does not continue this session: it must begin with the last prompt and the text it "
                "was answered", status=409)  # fmt: skip
        check_completion_turn(self.template, last, self.stop_ids)
        return self.template.encode(request.prompt[len(before) :])

    def _render(self, messages: list[dict[str, Any]], tools: Any, *, generation_prompt: bool) -> str:
        try:
            return self.template.render(messages, tools, generation_prompt=generation_prompt)
        except Exception as exc:  # noqa: BLE001 - a template's error is the request's problem
            raise RequestError(f"the model's chat template cannot render these messages: {exc}") from exc

    # ---- the end -------------------------------------------------------------------------------------------
    def check_last_turn(self) -> None:
        """The last turn against the template with the reply as answered (no later request sent it back)."""
        last = self.turns[-1] if self.turns else None
        if last is None or last.mismatch is not None:
            return
        if last.messages is not None:
            check_chat_turn(self.template, last, last.reply)
        elif last.prompt is not None:
            check_completion_turn(self.template, last, self.stop_ids)
        else:
            last.mismatch = False  # token-id prompts: nothing is rendered


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A parsed call as a chat template reads it (arguments as an object)."""
    function = call["function"]
    return {**call, "function": {"name": function["name"], "arguments": json.loads(function["arguments"])}}
