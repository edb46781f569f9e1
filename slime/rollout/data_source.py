"""Prompt data source: checked records -> groups of n `Sample`s, with epochs, shuffle, a buffer and state.

The source walks an offset through the (per-epoch shuffled) dataset; crossing the end starts a new
epoch with the permutation seeded by `data.seed` + epoch, so the order can be rebuilt from state alone
(docs/data-and-rewards.md#epochs-and-the-data-source). A FIFO buffer of groups handed back by the rollout
(aborted or partial groups) is served before fresh prompts, and is part of the saved state, so a resumed run loses
no prompt.

Every sample records `prompt_index` (its row in the dataset) and `epoch` (when it was drawn): the
rollout dumps (`debug.save_rollout_data`) show which prompt was trained in which epoch.

When `train.num_epoch` sizes the run, `max_groups` = `train.num_rollout` × `rollout.batch_size` bounds the
fresh groups served in the whole run: over-sampling draws ahead of training, and without the bound the
last steps would draw into an epoch past `num_epoch` while groups of the earlier epochs wait in the buffer.
With the bound, every group drawn is trained (the last step gets exactly what is left), so each prompt is
trained once per epoch; the last epoch is cut to whole rollout steps (its last prompts in shuffled order,
fewer than `batch_size`, are not drawn, like a data loader's `drop_last`).

A custom source (`data.source_class`) subclasses `DataSourceBase` and is built as
`cls(dataset, n_samples_per_prompt=..., shuffle=..., seed=...)`; `dataset` is the `PromptDataset` or None.
"""

from __future__ import annotations

import abc
import copy
import logging
import random
from collections.abc import Callable
from typing import Any, Optional

from slime.config.hooks import load_callable
from slime.config.problems import PicklableFields
from slime.rollout.prompt_file import RecordKeys, image_parts, read_records
from slime.types import Sample

logger = logging.getLogger(__name__)

BufferFilter = Callable[[list[list[Sample]], int], list[list[Sample]]]  # (buffer, num) -> groups taken


class PromptsTooLong(PicklableFields, ValueError):
    """Every prompt of a file is longer than `rollout.max_prompt_len`: nothing is left to train on."""

    def __init__(self, path: str, limit: int, lengths: list[int]):
        self.path, self.limit, self.shortest, self.longest = path, limit, min(lengths), max(lengths)
        self.count = len(lengths)
        super().__init__(
            f"{path}: all {self.count} prompts are longer than rollout.max_prompt_len={limit} tokens "
            f"(templated: {self.shortest} to {self.longest} tokens)"
        )


class PromptDataset:
    """Prompts ready for generation: chat-templated strings (or raw prompts), labels, metadata.

    With `apply_chat_template`, a string prompt becomes one user message and the messages are rendered
    once here (untokenised, generation prompt appended, the record's tools and `template_kwargs` passed
    to the template); `step_loss_mask` is stripped first. Without it, a string is used verbatim and a
    message list is kept as is. `sample.messages` keeps the messages (SFT builds its masks from them).
    Prompts longer than `max_prompt_len` tokens (templated, without special tokens) are dropped.
    """

    def __init__(
        self,
        path: str,
        *,
        tokenizer,
        input_key: str,
        label_key: Optional[str],
        metadata_key: Optional[str],
        apply_chat_template: bool,
        tool_key: Optional[str] = "tools",
        template_kwargs: Optional[dict[str, Any]] = None,
        max_prompt_len: Optional[int] = None,
        config_key: str = "data.prompt_data",
        image_key: Optional[str] = None,
        prompt_images=None,
    ):
        keys = RecordKeys(
            input_key=input_key, label_key=label_key, metadata_key=metadata_key, tool_key=tool_key, image_key=image_key
        )
        self.prompt_images = prompt_images  # slime.vision.prompt.PromptImages of a vision-language model
        self.path = path
        self.samples: list[Sample] = []
        self.dropped_lengths: list[int] = []  # tokens of each prompt dropped as longer than max_prompt_len
        for record in read_records(path, keys, key=config_key):
            prompt, messages = record.prompt, None
            if apply_chat_template:
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
                if record.images:
                    messages = with_image_parts(messages, len(record.images))
                prompt = render_prompt(tokenizer, messages, tools=record.tools, template_kwargs=template_kwargs)
            elif not isinstance(prompt, str):
                messages = prompt
            if max_prompt_len is not None and self._too_long(tokenizer, prompt, max_prompt_len, record):
                continue
            metadata = dict(record.metadata)
            if record.tools is not None:
                metadata["tools"] = record.tools
            self.samples.append(
                Sample(
                    prompt=prompt,
                    messages=messages,
                    label=record.label,
                    metadata=metadata,
                    images=record.images,
                    prompt_index=len(self.samples),
                )
            )
        if self.num_too_long:
            logger.info(
                "%s: dropped %d of %d prompts longer than rollout.max_prompt_len=%d tokens",
                path,
                self.num_too_long,
                self.num_too_long + len(self.samples),
                max_prompt_len,
            )
        if not self.samples:
            raise PromptsTooLong(path, max_prompt_len, self.dropped_lengths)

    @classmethod
    def from_data_config(
        cls, data, path: str, *, tokenizer, max_prompt_len: Optional[int] = None, prompt_images=None
    ) -> PromptDataset:
        """The prompts of `path`, read with `data`'s (a DataConfig) keys and templating (`prompt_images`: a
        vision-language model's, which counts each image's tokens)."""
        return cls(
            path,
            tokenizer=tokenizer,
            input_key=data.input_key,
            label_key=data.label_key,
            metadata_key=data.metadata_key,
            apply_chat_template=data.apply_chat_template,
            tool_key=data.tool_key,
            template_kwargs=data.apply_chat_template_kwargs,
            max_prompt_len=max_prompt_len,
            image_key=data.multimodal_keys.get("image"),
            prompt_images=prompt_images,
        )

    def _too_long(self, tokenizer, prompt, max_prompt_len: int, record) -> bool:
        if not isinstance(prompt, str):  # slime: only templated (string) prompts are measured
            logger.warning(
                "%s:%d: a message-list prompt is not length-filtered (chat template off)", self.path, record.line
            )
            return False
        if record.images and self.prompt_images is not None:  # each image counts its tokens
            length = len(self.prompt_images.prompt_ids(tokenizer, prompt, record.images))
        else:
            length = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if length <= max_prompt_len:
            return False
        self.dropped_lengths.append(length)
        return True

    @property
    def num_too_long(self) -> int:
        return len(self.dropped_lengths)

    def __len__(self) -> int:
        return len(self.samples)


def with_image_parts(messages: list[dict], count: int) -> list[dict]:
    """`messages` whose images are placed: as they are when a message holds image parts already (the record's
    check counted them), else `count` image parts opening the first user message, before its content."""
    if image_parts(messages):
        return messages
    out, placed = [], False
    for message in messages:
        if message["role"] == "user" and not placed:
            content = message.get("content") or []
            content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            message, placed = {**message, "content": [{"type": "image"}] * count + content}, True
        out.append(message)
    return out


def render_prompt(tokenizer, messages: list[dict], *, tools=None, template_kwargs=None) -> str:
    """The chat template over `messages` (step_loss_mask stripped), untokenised, with the generation prompt."""
    kwargs = dict(template_kwargs or {})
    if tools is not None:
        kwargs["tools"] = tools
    clean = [{k: v for k, v in m.items() if k != "step_loss_mask"} for m in messages]
    return tokenizer.apply_chat_template(clean, tokenize=False, add_generation_prompt=True, **kwargs)


class DataSourceBase(abc.ABC):
    """What the rollout asks of a data source (the `data.source_class` contract)."""

    max_groups: Optional[int] = None  # fresh groups to serve in the whole run (None: epochs without end)

    @abc.abstractmethod
    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups of n samples each: returned groups first, then fresh prompts (fewer once
        `max_groups` fresh groups were served)."""

    @abc.abstractmethod
    def add_groups(self, groups: list[list[Sample]]) -> None:
        """Take back groups (aborted or partial) to serve them before fresh prompts."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly here (saved with each checkpoint)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()`."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Prompts per epoch."""


class DataSource(DataSourceBase):
    """Serves groups of `n_samples_per_prompt` copies of each prompt with global indices.

    Without a dataset (None) it serves empty PENDING samples, for rollout functions that make their own
    prompts. `buffer_filter(buffer, num)` picks which buffered groups to serve (default: the oldest).
    `max_groups` bounds the fresh groups of the whole run (the module docstring says why).
    """

    def __init__(
        self,
        dataset: Optional[PromptDataset],
        *,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        buffer_filter: Optional[BufferFilter] = None,
        max_groups: Optional[int] = None,
    ):
        self.dataset = dataset
        self.max_groups = max_groups
        self.n = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_filter = buffer_filter
        self.epoch_id = 0
        self.sample_offset = 0  # prompts of the current epoch already served
        self.sample_group_index = 0
        self.sample_index = 0
        self.buffer: list[list[Sample]] = []
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else 0

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        groups = self._pop_buffer(num_groups)
        while len(groups) < num_groups and not self.exhausted:
            groups.append(self._fresh_group())
        return groups

    @property
    def exhausted(self) -> bool:
        """Every fresh group of the run was served (`max_groups`); the buffer may still hold some."""
        return self.max_groups is not None and self.sample_group_index >= self.max_groups

    def _pop_buffer(self, num: int) -> list[list[Sample]]:
        if not self.buffer:
            return []
        if self.buffer_filter is None:
            taken = self.buffer[:num]
        else:
            taken = list(self.buffer_filter(list(self.buffer), num))
            if len(taken) > num:
                raise ValueError(f"the buffer filter returned {len(taken)} groups, more than the {num} asked for")
        ids = {id(g) for g in taken}
        self.buffer = [g for g in self.buffer if id(g) not in ids]
        return taken

    def _fresh_group(self) -> list[Sample]:
        if self.dataset is None:
            prompt, prompt_index = Sample(), None
        else:
            if self.sample_offset >= len(self._order):
                self.epoch_id += 1
                self.sample_offset = 0
                self._order = self._permutation(self.epoch_id)
            prompt_index = self._order[self.sample_offset]
            prompt = self.dataset.samples[prompt_index]
            self.sample_offset += 1
        group = []
        for _ in range(self.n):
            sample = copy.deepcopy(prompt)
            sample.group_index = self.sample_group_index
            sample.index = self.sample_index
            sample.prompt_index = prompt_index
            sample.epoch = self.epoch_id
            self.sample_index += 1
            group.append(sample)
        self.sample_group_index += 1
        return group

    def add_groups(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            if len(group) != self.n:
                raise ValueError(f"a group handed back holds {len(group)} samples, expected {self.n}")
        self.buffer.extend(groups)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sample_offset": self.sample_offset,
            "epoch_id": self.epoch_id,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
            "buffer": [[s.to_dict() for s in g] for g in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sample_offset = state["sample_offset"]
        self.epoch_id = state["epoch_id"]
        self.sample_group_index = state["sample_group_index"]
        self.sample_index = state["sample_index"]
        self.buffer = [[Sample.from_dict(s) for s in g] for g in state.get("buffer", [])]
        self._order = self._permutation(self.epoch_id)


def build_data_source(
    data,
    path: str,
    *,
    tokenizer,
    n_samples_per_prompt: int,
    shuffle: bool,
    max_prompt_len: Optional[int] = None,
    max_groups: Optional[int] = None,
    prompt_images=None,
) -> DataSourceBase:
    """The data source over the prompt file at `path`, read with `data`'s (a DataConfig) keys and templating;
    its class is `data.source_class` when set. `max_groups` (see the module docstring) is set on it after
    construction, so a custom class keeps the documented constructor and may honour the bound or not."""
    dataset = PromptDataset.from_data_config(
        data, path, tokenizer=tokenizer, max_prompt_len=max_prompt_len, prompt_images=prompt_images
    )
    cls = load_callable(data.source_class, key="data.source_class") if data.source_class else DataSource
    source = cls(dataset, n_samples_per_prompt=n_samples_per_prompt, shuffle=shuffle, seed=data.seed)
    source.max_groups = max_groups
    return source
