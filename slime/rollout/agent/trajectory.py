"""An episode's turns as the chat template would render them: the structural check of each turn, the rule for a
turn that fails it, and the agent metrics of a rollout step.

The check of turn t: the template renders the turn's conversation with a generation prompt (A) and the
conversation with the assistant's reply appended (B); the turn matches when B begins with A followed by the ids the
engine sampled. Where it does not (a template that renders a separator, a tool call's JSON or a thinking block
otherwise than the model wrote it), a model served through that template would see other tokens than it was
trained on: the turn counts in `agent/retokenization_mismatch`, and `rollout.agent.on_mismatch` decides:
`drop_turn` (default) keeps its ids in the sequence (later turns saw them) with loss mask 0; `drop_episode` trains
nothing of the episode.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slime.types import Sample, SampleStatus

ON_MISMATCH = ("drop_turn", "drop_episode")


@dataclasses.dataclass(kw_only=True)
class TurnRecord:
    """One engine turn of an episode. `prompt_length`: tokens of the prompt it sent (the episode's tokens before
    its sampled ids); `sampled`: the ids the engine returned, byte for byte what is trained."""

    prompt_length: int
    sampled: list[int]
    weight_version: str
    finish_reason: str  # the engine's: stop | length | abort
    messages: list[dict[str, Any]] | None = None  # chat: the request's conversation
    tools: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None  # chat: the assistant message the gateway answered
    prompt: str | None = None  # completions: the request's prompt text
    text: str = ""  # completions: the text the gateway answered
    mismatch: bool | None = None  # None until checked

    def summary(self) -> dict[str, Any]:
        """What a dumped sample keeps of the turn."""
        keys = ("prompt_length", "sampled", "weight_version", "finish_reason", "mismatch")
        return {k: getattr(self, k) for k in keys}


@dataclasses.dataclass(frozen=True)
class Template:
    """The policy's tokenizer and the chat template the gateway renders with (None: the tokenizer's own;
    `rollout.agent.chat_template`)."""

    tokenizer: Any
    chat_template: str | None = None

    def render(self, messages: list[dict[str, Any]], tools: Any, *, generation_prompt: bool) -> str:
        """The template's text of `messages` (and `tools`)."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            chat_template=self.chat_template,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def check_chat_turn(template: Template, turn: TurnRecord, assistant: dict[str, Any]) -> list[int]:
    """Check `turn` against the template with `assistant` (the reply as the agent sent it back, or as answered);
    sets `turn.mismatch`. Returns the ids the template puts after the sampled ones (its end-of-turn separator),
    which the next turn's prompt carries."""
    a = template.encode(template.render(turn.messages, turn.tools, generation_prompt=True))
    b = template.encode(template.render([*turn.messages, assistant], turn.tools, generation_prompt=False))
    end = len(a) + len(turn.sampled)
    turn.mismatch = b[: len(a)] != a or b[len(a) : end] != turn.sampled
    return b[end:]


def check_completion_turn(template: Template, turn: TurnRecord, stop_ids: set[int]) -> None:
    """Completions: the prompt and the answered text, tokenized together, give the prompt's ids and the sampled
    ones (a final stop token is not in the text)."""
    a = template.encode(turn.prompt)
    b = template.encode(turn.prompt + turn.text)
    sampled = turn.sampled[:-1] if turn.sampled and turn.sampled[-1] in stop_ids else turn.sampled
    turn.mismatch = b[: len(a)] != a or b[len(a) :] != sampled


def apply_turns(sample: Sample, turns: list[TurnRecord], rule: str) -> None:
    """Record the turns in `sample.metadata["agent"]` and apply `rule` to the mismatching ones."""
    first_prompt = turns[0].prompt_length
    mismatched = [t for t in turns if t.mismatch]
    if mismatched and rule == "drop_episode":
        sample.loss_mask = [0] * sample.response_length
        sample.remove_sample = True
    elif mismatched:
        for turn in mismatched:
            start = turn.prompt_length - first_prompt
            sample.loss_mask[start : start + len(turn.sampled)] = [0] * len(turn.sampled)
    sample.metadata["agent"] = {
        "turns": [t.summary() for t in turns],
        "mismatched_turns": len(mismatched),
        "first_prompt_length": first_prompt,
    }


def agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """`agent/*` of a rollout step's samples (none without agent episodes): turns, mismatching turns, failed
    episodes (the agent raised or timed out)."""
    episodes = [s.metadata["agent"] for s in samples if isinstance(s.metadata.get("agent"), dict)]
    failed = [s for s in samples if s.status == SampleStatus.FAILED and (s.error or "").startswith("agent:")]
    if not episodes and not failed:
        return {}
    turns = [len(e.get("turns", [])) for e in episodes]
    return {
        "agent/retokenization_mismatch": float(sum(e.get("mismatched_turns", 0) for e in episodes)),
        "agent/turns_mean": sum(turns) / len(turns) if turns else 0.0,
        "agent/failed_episodes": float(len(failed)),
    }
