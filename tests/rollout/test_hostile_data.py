"""Hostile prompt files: each refused with file[:line] and what is wrong, or read correctly when it is fine."""

from __future__ import annotations

import json

import pytest

from slime.rollout.prompt_file import DataFileError, RecordKeys, read_records
from tests.helpers.validation import problems_for

KEYS = RecordKeys()
HUGE = 8 << 20  # bytes

# name: (file name, content, line named or None, text of the message)
BAD = {
    "empty prompt": (
        "a.jsonl",
        '{"prompt": "a", "label": "1"}\n{"prompt": "", "label": "2"}\n',
        2,
        "'prompt' is empty",
    ),
    "blank prompt": ("a.jsonl", '{"prompt": " \\n\\t ", "label": "2"}\n', 1, "'prompt' is empty"),
    "empty message list": ("a.jsonl", '{"prompt": [], "label": "1"}\n', 1, "non-empty list of messages"),
    "NaN label": ("a.jsonl", '{"prompt": "a", "label": NaN}\n', 1, "NaN is no JSON number"),
    "Infinity in metadata": (
        "a.jsonl",
        '{"prompt": "a", "label": "1", "metadata": {"w": -Infinity}}\n',
        1,
        "-Infinity is no JSON number",
    ),
    "list label": ("a.jsonl", '{"prompt": "a", "label": ["1", "2"]}\n', 1, "must be a string or a number, got list"),
    "UTF-16 file": ("a.jsonl", '{"prompt": "a", "label": "1"}\n'.encode("utf-16"), 1, "not UTF-8 text (byte 0xff"),
    "a .json file": ("a.json", '{"prompt": "a", "label": "1"}\n', None, "unknown file type"),
    "only a byte-order mark": ("a.jsonl", b"\xef\xbb\xbf\n", None, "holds no records"),
    "messages as plain strings": ("a.jsonl", '{"prompt": ["hi"], "label": "1"}\n', 1, "prompt[0] must be an object"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_prompt_file_names_file_and_line(case, tmp_path):
    name, content, line, text = BAD[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataFileError) as info:
        read_records(str(path), KEYS)
    where = f"{path}:{line}: " if line else f"{path}: "
    assert str(info.value).startswith(where) and text in str(info.value), str(info.value)


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "prompts.jsonl").mkdir()
    with pytest.raises(DataFileError, match="a directory, not a prompt file"):
        read_records(str(tmp_path / "prompts.jsonl"), KEYS)


def test_huge_unterminated_line_is_named_without_echoing_it(tmp_path):
    path = tmp_path / "huge.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "' + "x" * HUGE)  # cut mid-string, no newline
    with pytest.raises(DataFileError) as info:
        read_records(str(path), KEYS)
    assert str(info.value).startswith(f"{path}:2: not valid JSON") and len(str(info.value)) < 300


def test_huge_valid_line_is_read_whole(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "y" * HUGE, "label": 1}) + "\n")
    (record,) = read_records(str(path), KEYS)
    assert len(record.prompt) == HUGE and record.label == "1"  # labels are kept as text


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9", "label": "1"}\n{"prompt": "b", "label": "2"}\n')
    assert [r.prompt for r in read_records(str(path), KEYS)] == ["café", "b"]


def test_eval_prompt_file_that_is_a_directory_is_a_config_problem(tmp_path):
    (tmp_path / "eval.jsonl").mkdir()
    path = tmp_path / "eval.jsonl"
    found = problems_for(["recipe=embedded_eval", f"eval.datasets.digit_task.prompt_data={path}"], tmp_path / "run")
    assert f"{path}: a directory, not a prompt file" in found["eval.datasets.digit_task.prompt_data"], found


def test_prompt_file_with_one_bad_record_among_many_names_its_line(tmp_path):
    lines = [json.dumps({"prompt": f"q{i}", "label": str(i)}) for i in range(5000)]
    lines[3210] = json.dumps({"prompt": f"q{3210}"})  # the label is missing
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    found = problems_for([f"data.prompt_data={path}", "data.generator=null"], tmp_path / "run")
    assert f"{path}:3211: no key 'label' (data.label_key)" in found["data.prompt_data"]


@pytest.mark.parametrize("bounds", ["@[a:b]", "@[1.5:]", "@[3]", "@[0:10"])
def test_a_row_slice_whose_bounds_are_no_integers_is_named(bounds, tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n')
    with pytest.raises(DataFileError) as info:
        read_records(f"{path}{bounds}", KEYS)
    assert str(info.value) == (
        f"{path}{bounds}: the row slice {bounds!r} is not [start:end] with integer (or empty) bounds"
    )
    assert (
        info.value.fix
        == "write it as data.prompt_data='file.jsonl@[0:100]' (Python slice bounds: @[-50:] is the last 50 rows)"
    )


def test_a_file_whose_name_holds_an_at_bracket_is_read_whole(tmp_path):
    path = tmp_path / "odd@[name].jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": "2"}\n')
    assert [r.prompt for r in read_records(str(path), KEYS)] == ["a", "b"]
