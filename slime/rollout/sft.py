"""The SFT data path: chat conversations -> token ids and loss masks, and the SFT "rollout" function.

SFT reuses the RL pipeline: a rollout function turns prompt records into `Sample`s whose `tokens`,
`response_length` and `loss_mask` describe the conversation, and the trainer applies the SFT loss
(docs/algorithms.md#sft-loss) over the masked response tokens. Nothing is generated and no engine is called.

Mask rule (template-generic; slime has one mask generator per template family, this derives the
same masks from the chat template itself by rendering prefixes of the conversation):

* the tokens between render(messages[:i]) and render(messages[:i+1]) belong to message i;
* system, user and tool turns are 0;
* an assistant turn is 1, EXCEPT
  - its header: the tokens `add_generation_prompt=True` adds after messages[:i]
    (Qwen ChatML: `<|im_start|>assistant\\n`), which the engine is given, not asked to produce;
  - anything after the last EOS token of the turn (Qwen ChatML: the `\\n` after `<|im_end|>`),
    which the policy never generates: it stops at EOS and the template adds the newline;
* a message with `step_loss_mask: 0` (default 1) is 0 over its whole turn; the key is stripped
  before templating.

The prefix property (the ids of each rendered prefix are a prefix of the full conversation's ids) is
checked; templates that rewrite earlier turns when a message is appended (e.g. Qwen3 dropping the
reasoning of earlier assistant turns) raise a ValueError naming the message index.

`Sample` layout (docs/data-and-rewards.md#sft-data): response_length runs from the FIRST mask-1 token to
the end of the conversation, and `loss_mask` is the last response_length mask entries, so later
user/tool turns inside the response carry mask 0.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from slime.rollout.base import RolloutContext, RolloutOutput
from slime.types import Sample, SampleStatus

__all__ = ["conversation_tokens_and_mask", "sft_sample", "generate_rollout"]


def _render_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool, tools, template_kwargs) -> list[int]:
    kwargs = dict(template_kwargs)
    if tools is not None:
        kwargs["tools"] = tools
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _is_prefix(prefix: list[int], full: list[int]) -> bool:
    return len(prefix) <= len(full) and full[: len(prefix)] == prefix


def conversation_tokens_and_mask(
    tokenizer, messages: list[dict], *, tools: list[dict] | None = None, **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a 0/1 loss mask of the same length (see module docstring).

    The conversation is rendered with `tokenizer.apply_chat_template(..., tokenize=False,
    add_generation_prompt=False)` and tokenised with `add_special_tokens=False`. `tools` and
    `template_kwargs` (e.g. `enable_thinking=False`) are passed to every render.

    Raises ValueError for an empty conversation, a message without a role, or a template that breaks
    the prefix property (naming the message index).
    """
    if not messages:
        raise ValueError("SFT conversation is empty: need at least one message")
    clean: list[dict] = []
    trainable: list[bool] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"SFT message {i} must be a dict with a 'role' key, got {message!r}")
        clean.append({k: v for k, v in message.items() if k != "step_loss_mask"})
        trainable.append(int(message.get("step_loss_mask", 1)) != 0)

    render = lambda msgs, gen=False: _render_ids(  # noqa: E731
        tokenizer, msgs, add_generation_prompt=gen, tools=tools, template_kwargs=template_kwargs
    )
    full = render(clean)
    eos_id = getattr(tokenizer, "eos_token_id", None)

    mask: list[int] = []
    prev: list[int] = []  # ids of render(messages[:i]); HF cannot render an empty conversation
    for i, message in enumerate(clean):
        cur = full if i == len(clean) - 1 else render(clean[: i + 1])
        if not _is_prefix(cur, full) or not _is_prefix(prev, cur):
            raise ValueError(
                f"chat template breaks the prefix property at message {i} (role {message['role']!r}): the ids of "
                f"messages[:{i + 1}] are not a prefix of the whole conversation's ids (or messages[:{i}]'s ids are "
                f"not a prefix of them); the template rewrites earlier turns when a message is appended, so "
                f"per-turn loss masks cannot be derived from it"
            )
        segment = cur[len(prev) :]
        if message["role"] == "assistant" and trainable[i]:
            try:
                with_header = render(clean[:i], gen=True)  # [] only if the conversation opens with it
            except Exception as exc:  # noqa: BLE001 - template-specific failure, re-raised with context
                raise ValueError(f"cannot render the assistant header of message {i}: {exc}") from exc
            if not _is_prefix(prev, with_header) or not _is_prefix(with_header, cur):
                raise ValueError(
                    f"chat template breaks the prefix property at message {i} (assistant): the generation prompt "
                    f"rendered after messages[:{i}] is not a prefix of the assistant turn"
                )
            header = len(with_header) - len(prev)
            body = segment[header:]
            eos_at = [j for j, t in enumerate(body) if eos_id is not None and t == eos_id]
            trained = eos_at[-1] + 1 if eos_at else len(body)  # nothing after the turn's last EOS
            mask.extend([0] * header + [1] * trained + [0] * (len(body) - trained))
        else:
            mask.extend([0] * len(segment))
        prev = cur
    assert len(mask) == len(full)
    return full, mask


def _conversation(sample: Sample) -> list[dict]:
    messages = getattr(sample, "messages", None)
    if messages is None:
        if isinstance(sample.prompt, list):
            messages = sample.prompt
        elif isinstance(sample.prompt, str) and sample.prompt:
            messages = [{"role": "user", "content": sample.prompt}]
        else:
            raise ValueError(f"sample {sample.index}: no messages and no prompt to build an SFT conversation from")
    messages = [dict(m) for m in messages]  # never mutate the sample's own messages
    if not any(m.get("role") == "assistant" for m in messages):
        if sample.label is None:
            raise ValueError(
                f"sample {sample.index}: the conversation has no assistant turn and the sample has no label; SFT "
                f"needs a target: put an assistant message in the prompt or set data.label_key"
            )
        messages.append({"role": "assistant", "content": str(sample.label)})
    return messages


def sft_sample(tokenizer, sample: Sample) -> Sample:
    """Fill `sample` (in place; also returned) with the SFT tokens, response and loss mask of its conversation.

    The conversation is `sample.messages`, else `sample.prompt` (a message list, or a string taken as one
    user turn); with no assistant turn, `{"role": "assistant", "content": sample.label}` is appended.
    Tools come from `sample.metadata["tools"]` (a list or JSON string) and extra template kwargs from
    an `apply_chat_template_kwargs` attribute when present.
    """
    messages = _conversation(sample)
    tools = sample.metadata.get("tools") if isinstance(sample.metadata, dict) else None
    if isinstance(tools, str):
        tools = json.loads(tools)
    template_kwargs = getattr(sample, "apply_chat_template_kwargs", None) or {}
    tokens, mask = conversation_tokens_and_mask(tokenizer, messages, tools=tools, **template_kwargs)
    if 1 not in mask:
        raise ValueError(
            f"sample {sample.index}: no token carries loss (every assistant turn has step_loss_mask 0, or the "
            f"assistant turns are empty); roles were {[m.get('role') for m in messages]}"
        )
    first = mask.index(1)
    sample.tokens = tokens
    sample.response_length = len(tokens) - first
    sample.loss_mask = mask[first:]
    sample.response = tokenizer.decode(tokens[first:], skip_special_tokens=False)
    sample.rollout_log_probs = None
    sample.reward = 0.0
    sample.status = SampleStatus.COMPLETED
    sample.check_alignment()
    return sample


def generate_rollout(ctx: RolloutContext, rollout_id: int, data_source, evaluation: bool = False) -> RolloutOutput:
    """The SFT rollout: `ctx.batch_size` groups from `data_source`, each sample made an SFT sample.

    No generation and no engine calls. Evaluation is not defined for SFT data (there is no reward to
    report), so `evaluation=True` is refused with a ValueError; config validation already rejects
    eval with algo=sft (exit 2), so this only guards direct callers.
    """
    if evaluation:
        raise ValueError(
            "the SFT rollout function has no evaluation mode (there is nothing to generate or reward); "
            "disable evaluation for SFT runs"
        )
    start = time.perf_counter()
    groups = data_source.get_groups(ctx.batch_size)
    groups = [[sft_sample(ctx.tokenizer, sample) for sample in group] for group in groups]
    lengths = [s.effective_response_length for g in groups for s in g]
    metrics = {"perf/rollout_time": time.perf_counter() - start}
    if lengths:
        metrics.update(
            {
                "rollout/response_len/mean": float(statistics.fmean(lengths)),
                "rollout/response_len/median": float(statistics.median(lengths)),
                "rollout/response_len/max": float(max(lengths)),
                "rollout/response_len/min": float(min(lengths)),
            }
        )
    return RolloutOutput(groups=groups, metrics=metrics)
