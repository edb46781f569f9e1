"""Prompt records with images (data.multimodal_keys): read, placed in the chat, counted; a bad one refused before
launch with its file and line; a run with images refused when its other parts cannot carry them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slime.rollout.data_source import PromptDataset, with_image_parts
from slime.rollout.prompt_file import DataFileError, RecordKeys, read_records
from slime.vision.prompt import PromptImages
from tests.helpers.compose import ROOT
from tests.helpers.images import png_file, shape_records, write_records
from tests.helpers.validation import problems_for

KEYS = RecordKeys(image_key="images")
CELLS = ["red", "red", None, "green"]


def test_a_relative_path_is_read_from_the_files_directory(tmp_path):
    png_file(tmp_path / "one.png", CELLS)
    path = write_records(
        tmp_path / "p.jsonl", [{"prompt": "how many red squares ?", "images": "one.png", "label": "2"}]
    )
    (record,) = read_records(str(path), KEYS)
    assert record.images == [str((tmp_path / "one.png").resolve())]


BAD = {
    "missing file": ({"images": ["nowhere.png"]}, "images[0]: no such image file: nowhere.png"),
    "not an image": ({"images": ["notes.png"]}, "images[0]: "),
    "no image key": ({}, "no key 'images' (data.multimodal_keys.image)"),
    "empty list": ({"images": []}, "must be an image reference or a non-empty list"),
    "a number": ({"images": [7]}, "must be an image reference or a non-empty list"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_image_names_its_record_and_line(case, tmp_path):
    (tmp_path / "notes.png").write_text("plain text")
    fields, text = BAD[case]
    good = shape_records(2)
    path = write_records(tmp_path / "p.jsonl", [*good, {"prompt": "how many red squares ?", "label": "1", **fields}])
    with pytest.raises(DataFileError) as info:
        read_records(str(path), KEYS)
    assert str(info.value).startswith(f"{path}:3: ") and text in str(info.value), str(info.value)
    if case == "not an image":
        assert "is not an image PIL can read" in str(info.value)


def test_image_parts_in_the_messages_must_match_the_images(tmp_path):
    record = {
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "a"}]}],
        "images": shape_records(1)[0]["images"],
        "label": "1",
    }
    path = write_records(tmp_path / "p.jsonl", [record])
    with pytest.raises(DataFileError, match="places 2 image parts for the 1 images"):
        read_records(str(path), KEYS)


def test_images_open_the_user_turn_and_count_their_tokens(tiny_vlm_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    images = PromptImages.of_checkpoint(tiny_vlm_dir)
    path = write_records(tmp_path / "p.jsonl", shape_records(3))
    dataset = PromptDataset(
        str(path),
        tokenizer=tokenizer,
        input_key="prompt",
        label_key="label",
        metadata_key="metadata",
        apply_chat_template=True,
        image_key="images",
        prompt_images=images,
        max_prompt_len=16,  # 12 tokens of text + 4 image tokens: fits
    )
    sample = dataset.samples[0]
    assert sample.messages[0]["content"][0] == {"type": "image"} and sample.images == shape_records(3)[0]["images"]
    assert sample.prompt.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>how many")
    ids = images.prompt_ids(tokenizer, sample.prompt, sample.images)
    assert len(ids) == 16 and ids.count(images.tokens.image_pad) == 4
    too_short = dict(tokenizer=tokenizer, input_key="prompt", label_key="label", metadata_key="metadata")
    with pytest.raises(ValueError, match="all 3 prompts are longer than rollout.max_prompt_len=15 tokens"):
        PromptDataset(
            str(path),
            **too_short,
            apply_chat_template=True,
            image_key="images",
            prompt_images=images,
            max_prompt_len=15,
        )


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["model=tiny_qwen3", "+data.multimodal_keys.image=images"], "data.multimodal_keys.image", "reads no images"),
        (["model=tiny_qwen2_5_vl", "+data.multimodal_keys.video=v"], "data.multimodal_keys.video", "only images"),
        (["model=tiny_qwen2_5_vl", "rollout=vllm"], "rollout.engine", "this engine's requests carry no images"),
        (["model=tiny_qwen2_5_vl", "model.lora.rank=8"], "model.lora.rank", "wrap the vision tower"),
        (["model=tiny_qwen2_5_vl", "algo=ppo"], "algo.advantage_estimator", "built for text models only"),
        (["model=tiny_qwen2_5_vl", "parallelism=megatron"], "model.architecture", "builds text decoders only"),
        (["model=tiny_qwen3", "train.freeze_vision=true"], "train.freeze_vision", "has no vision tower"),
    ],
)
def test_a_run_whose_parts_cannot_carry_images_is_refused(overrides, key, text, tmp_path):
    problems = problems_for(overrides, tmp_path / "run")
    assert key in problems and text in problems[key], problems


def test_main_py_exits_2_naming_the_record_with_a_bad_image(tmp_path):
    records = shape_records(3)
    records[1]["images"] = [str(tmp_path / "gone.png")]
    path = write_records(tmp_path / "p.jsonl", records)
    proc = subprocess.run(
        [sys.executable, "main.py", "recipe=tiny_vlm", f"data.prompt_data={path}", f"paths.root_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{path}:2: images[0]: no such image file: {tmp_path / 'gone.png'}" in proc.stderr
    assert not (tmp_path / "outputs").exists()
    assert json.loads(path.read_text().splitlines()[0])["label"] == records[0]["label"]  # the file as it was


def test_images_open_a_user_turn_written_as_parts_that_places_none():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "how"}]}]
    placed = with_image_parts(messages, 2)
    assert placed[1]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "how"}]
    assert placed[0] == messages[0] and with_image_parts(placed, 2) == placed  # placed once
