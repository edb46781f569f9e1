"""Prompt data source: JSONL/parquet rows -> groups of n `Sample`s, with epochs, shuffle and state.

The source walks an offset through the (per-epoch shuffled) dataset; crossing the end starts a new
epoch with the permutation seeded by seed + epoch, so the order can be rebuilt from state alone
(REFERENCE.md §5.2). A FIFO buffer of groups is served before fresh prompts.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any

from slime.types import Sample

_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .parquet file; `path@[start:end]` selects a slice (negative bounds allowed)."""
    match = _SLICE.match(path)
    start = end = None
    if match:
        path = match["path"]
        start = int(match["start"]) if match["start"] else None
        end = int(match["end"]) if match["end"] else None
    file = Path(path)
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(file).to_pylist()
    else:
        rows = []
        with file.open() as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{file}:{line_no}: not valid JSON ({exc.msg}); each line must be one JSON object"
                    ) from exc
    return rows[start:end]


class PromptDataset:
    """Prompts ready for generation: chat-templated strings (or raw prompts), labels, metadata."""

    def __init__(
        self,
        path: str,
        *,
        tokenizer,
        input_key: str,
        label_key: str | None,
        metadata_key: str | None,
        apply_chat_template: bool,
    ):
        self.samples: list[Sample] = []
        for row_no, row in enumerate(read_rows(path)):
            if input_key not in row:
                raise KeyError(f"{path} row {row_no}: no key {input_key!r} (data.input_key); keys are {sorted(row)}")
            prompt = row[input_key]
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if apply_chat_template:
                prompt = tokenizer.apply_chat_template(
                    [{k: v for k, v in m.items() if k != "step_loss_mask"} for m in messages],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            elif isinstance(prompt, str):
                messages = None  # used verbatim
            label = row.get(label_key) if label_key else None
            metadata = dict(row.get(metadata_key) or {}) if metadata_key else {}
            self.samples.append(
                Sample(prompt=prompt, messages=messages, label=None if label is None else str(label), metadata=metadata)
            )
        if not self.samples:
            raise ValueError(f"{path}: no prompts")

    def __len__(self) -> int:
        return len(self.samples)


class DataSource:
    """Serves groups of `n_samples_per_prompt` copies of each prompt with global indices."""

    def __init__(self, dataset: PromptDataset, *, n_samples_per_prompt: int, shuffle: bool, seed: int):
        self.dataset = dataset
        self.n = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.epoch_id = 0
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.buffer: list[list[Sample]] = []
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups: buffered ones first, then fresh prompts (crossing epochs as needed)."""
        groups = self.buffer[:num_groups]
        del self.buffer[:num_groups]
        while len(groups) < num_groups:
            if self.sample_offset >= len(self._order):
                self.epoch_id += 1
                self.sample_offset = 0
                self._order = self._permutation(self.epoch_id)
            prompt = self.dataset.samples[self._order[self.sample_offset]]
            self.sample_offset += 1
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(prompt)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def add_groups(self, groups: list[list[Sample]]) -> None:
        """Return groups to the buffer (served before fresh prompts)."""
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
