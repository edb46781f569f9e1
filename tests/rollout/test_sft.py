"""SFT data path: chat-template loss masks, SFT samples, and the SFT rollout function (CPU, real tokenizer)."""

from __future__ import annotations

import json
import re

import pytest

from slime.assets.digit_task import make_prompt
from slime.assets.tokenizer import build_tokenizer
from slime.config.schema import RolloutConfig
from slime.rollout.base import RolloutContext
from slime.rollout.data_source import DataSource, PromptDataset
from slime.rollout.rewards import RewardHub
from slime.rollout.sft import conversation_tokens_and_mask, generate_rollout, sft_sample
from slime.types import Sample, SampleStatus


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


TWO_TURNS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 1 plus 1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "What is 2 plus 2?"},
    {"role": "assistant", "content": "4"},
]

# The embedded tokenizer's pre-tokenizer splits on whitespace, so the `\n` the ChatML template renders after
# each role and after `<|im_end|>` produces no token at all: each turn is `<|im_start|> role words... <|im_end|>`.
TWO_TURNS_TOKENS = [
    "<|im_start|>",
    "system",
    "you",
    "are",
    "a",
    "helpful",
    "assistant",
    ".",
    "<|im_end|>",
    "<|im_start|>",
    "user",
    "what",
    "is",
    "1",
    "plus",
    "1",
    "?",
    "<|im_end|>",
    "<|im_start|>",
    "assistant",
    "2",
    "<|im_end|>",
    "<|im_start|>",
    "user",
    "what",
    "is",
    "2",
    "plus",
    "2",
    "?",
    "<|im_end|>",
    "<|im_start|>",
    "assistant",
    "4",
    "<|im_end|>",
]
TWO_TURNS_MASK = (
    [0] * 9
    + [0] * 9
    + [0, 0, 1, 1]  # header `<|im_start|> assistant` is 0; content `2` and `<|im_end|>` are 1
    + [0] * 9
    + [0, 0, 1, 1]
)


def strings(tok, ids):
    return tok.convert_ids_to_tokens(ids)


def test_two_turn_mask_exact(tok):
    ids, mask = conversation_tokens_and_mask(tok, TWO_TURNS)
    assert strings(tok, ids) == TWO_TURNS_TOKENS
    assert mask == TWO_TURNS_MASK
    # the ids are exactly the templated conversation tokenised without special tokens
    text = tok.apply_chat_template(TWO_TURNS, tokenize=False, add_generation_prompt=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert [t for t, m in zip(strings(tok, ids), mask) if m] == ["2", "<|im_end|>", "4", "<|im_end|>"]


def test_sft_sample_two_turns(tok):
    sample = Sample(prompt="ignored when messages are set", index=3)
    sample.messages = [dict(m) for m in TWO_TURNS]
    out = sft_sample(tok, sample)
    assert out is sample
    first = TWO_TURNS_MASK.index(1)  # the first assistant content token `2`
    assert strings(tok, sample.tokens) == TWO_TURNS_TOKENS
    assert sample.response_length == len(TWO_TURNS_TOKENS) - first == 15
    assert sample.loss_mask == TWO_TURNS_MASK[first:]
    assert strings(tok, sample.tokens[sample.prompt_length :])[:2] == ["2", "<|im_end|>"]
    assert sample.effective_response_length == 4
    assert sample.reward == 0.0 and sample.status == SampleStatus.COMPLETED and sample.rollout_log_probs is None
    assert sample.response.split()[0] == "2"
    sample.check_alignment()


def test_step_loss_mask_zero_first_assistant(tok):
    messages = [dict(m) for m in TWO_TURNS]
    messages[2]["step_loss_mask"] = 0
    ids, mask = conversation_tokens_and_mask(tok, messages)
    plain_ids, _ = conversation_tokens_and_mask(tok, TWO_TURNS)
    assert ids == plain_ids  # the key is stripped before templating
    assert mask == [0] * 31 + [0, 0, 1, 1]

    sample = Sample(index=0)
    sample.messages = messages
    sft_sample(tok, sample)
    assert sample.response_length == 2  # starts at the second assistant turn's content
    assert strings(tok, sample.tokens[sample.prompt_length :]) == ["4", "<|im_end|>"]
    assert sample.loss_mask == [1, 1]
    assert messages[2]["step_loss_mask"] == 0  # the caller's messages are left alone


def test_digit_task_record_gets_label_as_assistant_turn(tok):
    record = make_prompt(7)
    sample = Sample(prompt=record["prompt"], label=record["label"], metadata=record["metadata"], index=0)
    sample.messages = record["prompt"]
    sft_sample(tok, sample)
    assert strings(tok, sample.tokens) == [
        "<|im_start|>",
        "user",
        "what",
        "comes",
        "after",
        "7",
        "?",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
        "8",
        "<|im_end|>",
    ]
    assert sample.response_length == 2 and sample.loss_mask == [1, 1]
    assert strings(tok, sample.tokens[-2:]) == ["8", "<|im_end|>"]
    assert len(sample.messages) == 1  # the appended assistant turn is not written back


def test_plain_string_prompt_becomes_user_turn(tok):
    sample = Sample(prompt="What comes after 3?", label="4", index=0)  # no `messages` attribute at all
    sft_sample(tok, sample)
    assert strings(tok, sample.tokens) == [
        "<|im_start|>",
        "user",
        "what",
        "comes",
        "after",
        "3",
        "?",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
        "4",
        "<|im_end|>",
    ]
    assert sample.loss_mask == [1, 1]


def test_no_target_raises(tok):
    sample = Sample(prompt="What comes after 3?", index=5)
    with pytest.raises(ValueError, match="no assistant turn and the sample has no label"):
        sft_sample(tok, sample)
    sample = Sample(index=6)
    sample.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4", "step_loss_mask": 0}]
    with pytest.raises(ValueError, match="no token carries loss"):
        sft_sample(tok, sample)


class FakeChatTokenizer:
    """A tokenizer-like object with a ChatML template where `\\n` IS a token (as in real Qwen tokenizers).

    With `drop_old_reasoning=True` the template, like Qwen3's, drops `<think>...</think>` from assistant
    turns that are not the last message, so appending a message rewrites earlier text.
    """

    _PATTERN = re.compile(r"<\|[a-z_]+\|>|<think>|</think>|\n|\w+|[^\w\s]")

    def __init__(self, drop_old_reasoning: bool = False):
        self.drop_old_reasoning = drop_old_reasoning
        self.vocab: dict[str, int] = {}
        self.eos_token_id = self._id("<|im_end|>")

    def _id(self, token: str) -> int:
        return self.vocab.setdefault(token, len(self.vocab))

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kwargs):
        assert not tokenize
        out = ""
        for i, m in enumerate(messages):
            content = m["content"]
            if self.drop_old_reasoning and m["role"] == "assistant" and i < len(messages) - 1:
                content = re.sub(r"<think>.*?</think>", "", content)
            out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
        return out

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self._id(t) for t in self._PATTERN.findall(text)]}

    def convert_ids_to_tokens(self, ids):
        inverse = {v: k for k, v in self.vocab.items()}
        return [inverse[i] for i in ids]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.convert_ids_to_tokens(ids))


def test_trailing_newline_after_eos_is_not_trained():
    fake = FakeChatTokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo there"}]
    ids, mask = conversation_tokens_and_mask(fake, messages)
    pairs = list(zip(fake.convert_ids_to_tokens(ids), mask))
    assert pairs == [
        ("<|im_start|>", 0),
        ("user", 0),
        ("\n", 0),
        ("hi", 0),
        ("<|im_end|>", 0),
        ("\n", 0),
        ("<|im_start|>", 0),
        ("assistant", 0),
        ("\n", 0),  # header: what add_generation_prompt=True adds
        ("yo", 1),
        ("there", 1),
        ("<|im_end|>", 1),
        ("\n", 0),  # after EOS: the policy stops at <|im_end|>, the template adds the newline
    ]


def test_prefix_property_violation_raises():
    fake = FakeChatTokenizer(drop_old_reasoning=True)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>hmm</think>yo"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "ok"},
    ]
    with pytest.raises(ValueError, match=r"prefix property at message 1\b"):
        conversation_tokens_and_mask(fake, messages)
    # without reasoning in earlier turns the same template is fine
    messages[1]["content"] = "yo"
    ids, mask = conversation_tokens_and_mask(fake, messages)
    assert [t for t, m in zip(fake.convert_ids_to_tokens(ids), mask) if m] == ["yo", "<|im_end|>", "ok", "<|im_end|>"]


def _ctx(tok, batch_size):
    return RolloutContext(
        config=RolloutConfig(batch_size=batch_size),
        router_url="http://unused.invalid",
        tokenizer=tok,
        batch_size=batch_size,
        over_sampling_batch_size=batch_size,
        sampling_params={"max_new_tokens": 8},
        max_in_flight=1,
        rewards=RewardHub(rm_type=None, custom_rm_path=None),
    )


def _check_groups(tok, groups, batch_size, n):
    assert len(groups) == batch_size
    for g, group in enumerate(groups):
        assert len(group) == n
        for sample in group:
            sample.check_alignment()
            assert sample.group_index == groups[0][0].group_index + g
            assert sample.status == SampleStatus.COMPLETED and sample.reward == 0.0
            assert sample.loss_mask[0] == 1 and len(sample.tokens) == sample.prompt_length + sample.response_length
            assert strings(tok, sample.tokens[-2:])[1] == "<|im_end|>"


def test_generate_rollout_string_prompts_through_prompt_dataset(tok, tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"What comes after {d}?", "label": str(d + 1)}) + "\n" for d in range(4))
    )
    dataset = PromptDataset(
        str(path), tokenizer=tok, input_key="prompt", label_key="label", metadata_key=None, apply_chat_template=False
    )
    source = DataSource(dataset, n_samples_per_prompt=2, shuffle=False, seed=1)
    out = generate_rollout(_ctx(tok, 3), 0, source)
    _check_groups(tok, out.groups, 3, 2)
    assert [strings(tok, s.tokens[s.prompt_length :]) for s in out.groups[2]] == [["3", "<|im_end|>"]] * 2
    assert out.metrics["rollout/response_len/mean"] == 2.0 and out.metrics["perf/rollout_time"] >= 0
    # the next call continues where the data source left off, crossing into epoch 1
    out = generate_rollout(_ctx(tok, 3), 1, source)
    _check_groups(tok, out.groups, 3, 2)
    assert [g[0].label for g in out.groups] == ["4", "1", "2"] and source.epoch_id == 1
    with pytest.raises(ValueError, match="no evaluation mode"):
        generate_rollout(_ctx(tok, 1), 2, source, evaluation=True)


def test_generate_rollout_message_records(tok, tmp_path):
    """Digit-task records (message lists). Through PromptDataset once it keeps `sample.messages` with templating
    off; until then, the same records as Samples built directly."""
    records = [make_prompt(d) for d in (1, 5, 9)]
    path = tmp_path / "digits.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    try:
        dataset = PromptDataset(
            str(path),
            tokenizer=tok,
            input_key="prompt",
            label_key="label",
            metadata_key="metadata",
            apply_chat_template=False,
        )
    except ValueError:  # PromptDataset without message support for apply_chat_template=False
        dataset = PromptDataset.__new__(PromptDataset)
        dataset.samples = []
        for r in records:
            sample = Sample(prompt=r["prompt"], label=r["label"], metadata=r["metadata"])
            sample.messages = r["prompt"]
            dataset.samples.append(sample)
    source = DataSource(dataset, n_samples_per_prompt=1, shuffle=False, seed=1)
    out = generate_rollout(_ctx(tok, 3), 0, source)
    _check_groups(tok, out.groups, 3, 1)
    answers = [strings(tok, g[0].tokens[g[0].prompt_length :]) for g in out.groups]
    assert answers == [["2", "<|im_end|>"], ["6", "<|im_end|>"], ["0", "<|im_end|>"]]
    assert all(g[0].loss_mask == [1, 1] for g in out.groups)
