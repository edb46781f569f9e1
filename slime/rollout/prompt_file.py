"""Reading prompt files: `.jsonl` / `.parquet` records, checked row by row (docs/data-and-rewards.md#prompt-files).

Torch-free and cheap to import: config validation calls `read_records` before anything starts, so a
malformed line, a missing key, a wrong type, non-UTF-8 bytes or an empty file stops the run with exit 2
and a message naming the file and line (`DataFileError`). The rollout manager reads the same records
again to build its `PromptDataset`.

A path may carry a row slice `file@[start:end]` (Python slice bounds, negative ones allowed); line
numbers in errors are the file's own, 1-based (parquet: row numbers, 1-based).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Optional

from slime.config.problems import PicklableFields
from slime.vision.images import ImageError, image_size

_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


UTF8_BOM = b"\xef\xbb\xbf"


class DataFileError(PicklableFields, ValueError):
    """A prompt file that cannot be used; `where` is `file:line` (or just the file), `key` the config field."""

    def __init__(self, where: str, message: str, *, key: str = "data.prompt_data", fix: Optional[str] = None):
        self.where, self.message, self.key = where, message, key
        self.fix = fix or "fix that record (or point the key option at the right field)"
        super().__init__(f"{where}: {message}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordKeys:
    """Which field of a record holds what (the `data.*_key` options); None: the record has no such field."""

    input_key: str = "prompt"
    label_key: Optional[str] = "label"
    metadata_key: Optional[str] = "metadata"
    tool_key: Optional[str] = "tools"
    image_key: Optional[str] = None  # data.multimodal_keys.image: the record's image references


@dataclasses.dataclass(frozen=True)
class Record:
    """One checked record: where it came from and its fields (prompt is a string or a list of messages)."""

    line: int  # 1-based line (row) of the file
    prompt: str | list[dict[str, Any]]
    label: Optional[str]
    metadata: dict[str, Any]
    tools: Optional[list[dict[str, Any]]]
    images: Optional[list[str]] = None  # image references (a path relative to the file made absolute)


def split_slice(spec: str, *, key: str = "data.prompt_data") -> tuple[str, Optional[int], Optional[int]]:
    """`file@[start:end]` -> (file, start, end); a plain path -> (path, None, None). A `@[` that opens no
    `[start:end]` of integers (and is not part of an existing file's name) is a DataFileError."""
    match = _SLICE.match(spec)
    if not match:
        if "@[" in spec and not Path(spec).exists():
            raise DataFileError(
                spec,
                f"the row slice {'@[' + spec.split('@[', 1)[1]!r} is not [start:end] with integer (or empty) bounds",
                key=key,
                fix=f"write it as {key}='file.jsonl@[0:100]' (Python slice bounds: @[-50:] is the last 50 rows)",
            )
        return spec, None, None
    bound = lambda text: int(text) if text else None  # noqa: E731
    return match["path"], bound(match["start"]), bound(match["end"])


def read_records(spec: str, keys: RecordKeys, *, key: str = "data.prompt_data") -> list[Record]:
    """Every record of the (sliced) file, checked; DataFileError naming file and line for the first bad one."""
    path, start, end = split_slice(spec, key=key)
    rows = _read_rows(Path(path), key)
    if not rows:
        raise DataFileError(path, "the file holds no records (empty file)", key=key)
    selected = rows[start:end]
    if not selected:
        raise DataFileError(path, f"the row slice [{start}:{end}] selects none of its {len(rows)} records", key=key)
    return [_check(path, line, row, keys, key) for line, row in selected]


def count_records(spec: str) -> Optional[int]:
    """Number of records the (sliced) file yields, counted without checking them; None if it cannot be read."""
    try:
        path, start, end = split_slice(spec)
        file = Path(path)
        if file.suffix == ".parquet":
            total = _parquet().ParquetFile(file).metadata.num_rows
        else:
            with file.open("rb") as f:
                total = sum(1 for line in f if line.strip())
    except Exception:  # validation reports unreadable files; counting just gives up
        return None
    return len(range(total)[start:end])


def _read_rows(file: Path, key: str) -> list[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank JSONL line, or of every parquet row."""
    if file.is_dir():
        raise DataFileError(str(file), "a directory, not a prompt file; give the .jsonl or .parquet file", key=key)
    if file.suffix == ".parquet":
        return _read_parquet(file, key)
    if file.suffix != ".jsonl":
        raise DataFileError(str(file), "unknown file type; prompt files are .jsonl or .parquet", key=key)
    rows = []
    with file.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            if line_no == 1:
                raw = raw.removeprefix(UTF8_BOM)  # as some editors start a UTF-8 file
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(
                    f"{file}:{line_no}",
                    f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); re-encode the file as UTF-8",
                    key=key,
                ) from None
            if not text.strip():
                continue
            try:
                rows.append((line_no, json.loads(text, parse_constant=_no_constant)))
            except json.JSONDecodeError as exc:
                raise DataFileError(
                    f"{file}:{line_no}",
                    f"not valid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON object",
                    key=key,
                ) from None
            except ValueError as exc:  # NaN / Infinity: Python's json reads them, JSON has no such numbers
                raise DataFileError(f"{file}:{line_no}", f"not valid JSON ({exc})", key=key) from None
    return rows


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number; write the value as a string or a finite number")


def _parquet():
    """pyarrow.parquet, loaded only for a .parquet prompt file (validation reads the others without it)."""
    import pyarrow.parquet  # pyarrow takes seconds to import; most runs read JSONL

    return pyarrow.parquet


def _read_parquet(file: Path, key: str) -> list[tuple[int, Any]]:
    pq = _parquet()
    try:
        table = pq.read_table(file)
    except Exception as exc:  # pyarrow raises several types for a corrupt or non-parquet file
        raise DataFileError(str(file), f"not a readable parquet file ({type(exc).__name__}: {exc})", key=key) from None
    return list(enumerate(table.to_pylist(), 1))


def _check(path: str, line: int, row: Any, keys: RecordKeys, key: str) -> Record:
    where = f"{path}:{line}"
    fail = lambda message: DataFileError(where, message, key=key)  # noqa: E731
    if not isinstance(row, dict):
        raise fail(f"expected a JSON object, got {type(row).__name__}")
    if keys.input_key not in row:
        raise fail(f"no key {keys.input_key!r} (data.input_key); the record's keys are {sorted(row)}")
    prompt = _check_prompt(row[keys.input_key], keys.input_key, fail)
    label = None
    if keys.label_key is not None:
        if keys.label_key not in row:
            raise fail(
                f"no key {keys.label_key!r} (data.label_key); the record's keys are {sorted(row)} "
                "(set data.label_key=null if the records carry no labels)"
            )
        label = row[keys.label_key]
        if isinstance(label, bool) or not isinstance(label, (str, int, float)):
            raise fail(f"{keys.label_key!r} must be a string or a number, got {type(label).__name__}")
        label = str(label)
    metadata = {}
    if keys.metadata_key is not None and row.get(keys.metadata_key) is not None:
        metadata = row[keys.metadata_key]
        if isinstance(metadata, str):
            metadata = _json_field(metadata, keys.metadata_key, fail)
        if not isinstance(metadata, dict):
            raise fail(f"{keys.metadata_key!r} (data.metadata_key) must be an object, got {type(metadata).__name__}")
    tools = None
    if keys.tool_key is not None and row.get(keys.tool_key) is not None:
        tools = row[keys.tool_key]
        if isinstance(tools, str):
            tools = _json_field(tools, keys.tool_key, fail)
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise fail(f"{keys.tool_key!r} (data.tool_key) must be a list of tool objects (or its JSON string)")
    images = None if keys.image_key is None else _check_images(row, keys.image_key, Path(path).parent, fail)
    if images is not None:
        _check_image_parts(prompt, len(images), keys, fail)
    return Record(line=line, prompt=prompt, label=label, metadata=dict(metadata), tools=tools, images=images)


def _check_images(row: dict, image_key: str, base: Path, fail) -> list[str]:
    """The record's image references (a string or a list of them), each readable as an image; a relative path
    is taken from the prompt file's directory."""
    if image_key not in row:
        raise fail(f"no key {image_key!r} (data.multimodal_keys.image); the record's keys are {sorted(row)}")
    refs = row[image_key]
    refs = [refs] if isinstance(refs, str) else refs
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r for r in refs):
        raise fail(f"{image_key!r} must be an image reference or a non-empty list of them (paths, URLs or base64)")
    resolved = []
    for i, ref in enumerate(refs):
        if not ref.startswith(("data:", "http://", "https://", "file://", "/")) and (base / ref).is_file():
            ref = str((base / ref).resolve())
        try:
            image_size(ref, verify=True)
        except ImageError as exc:
            raise fail(f"{image_key}[{i}]: {exc}") from None
        resolved.append(ref)
    return resolved


def image_parts(messages: list[dict[str, Any]]) -> int:
    """How many `{"type": "image"}` content parts the messages hold (where a message places an image itself)."""
    parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]]
    return sum(1 for p in parts if isinstance(p, dict) and p.get("type") == "image")


def _check_image_parts(prompt: str | list[dict[str, Any]], count: int, keys: RecordKeys, fail) -> None:
    """A message-list prompt that places its images itself holds one `{"type": "image"}` part per image."""
    if isinstance(prompt, str):
        return
    placed = image_parts(prompt)
    if placed and placed != count:
        raise fail(
            f"{keys.input_key!r} places {placed} image parts for the {count} images of {keys.image_key!r}; "
            'give one {"type": "image"} part per image, or none (the images then open the first user message)'
        )


def _json_field(text: str, name: str, fail) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"{name!r} is a string but not valid JSON ({exc.msg})") from None


def _check_prompt(prompt: Any, input_key: str, fail) -> str | list[dict[str, Any]]:
    """A string, or a non-empty list of {role, content[, step_loss_mask]} messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise fail(f"{input_key!r} is empty; every record needs a prompt")
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise fail(f"{input_key!r} must be a string or a non-empty list of messages, got {type(prompt).__name__}")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise fail(f"{input_key}[{i}] must be an object with a string 'role'")
        if message["role"] not in MESSAGE_ROLES:
            raise fail(f"{input_key}[{i}].role={message['role']!r}; expected one of {list(MESSAGE_ROLES)}")
        content = message.get("content")  # None: absent (JSONL) or null (parquet fills a missing field so)
        if content is None and not message.get("tool_calls"):  # an assistant's tool call may carry no text
            raise fail(f"{input_key}[{i}] has no 'content'; every message needs one (a string)")
        if not isinstance(content, (str, list, type(None))):
            raise fail(f"{input_key}[{i}].content must be a string, got {type(content).__name__}")
        mask = message.get("step_loss_mask")  # None: absent (parquet fills a struct's missing fields with None)
        if mask is not None and (isinstance(mask, bool) or mask not in (0, 1)):
            raise fail(f"{input_key}[{i}].step_loss_mask must be 0 or 1, got {mask!r}")
    return [dict(m) for m in prompt]
