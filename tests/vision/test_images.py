"""Image references (path, data URL, base64) and a prompt's image tokens, counted as the real processor counts them."""

from __future__ import annotations

import base64

import pytest
from PIL import Image

from slime.rollout.step_result import sample_preview
from slime.types import Sample
from slime.vision.images import ImageError, encode_png, image_size, load_image
from slime.vision.processor import ImageTokens, expand_image_pads, pixel_inputs
from slime.vision.prompt import PromptImages
from tests.helpers.images import png_file

CELLS = ["red", None, "green", "red"]


def test_every_reference_form_loads_the_same_pixels(tmp_path):
    path = png_file(tmp_path / "a.png", CELLS)
    url = encode_png(Image.open(path))
    forms = [str(path), f"file://{path}", url, url.split(",", 1)[1]]
    images = [load_image(ref) for ref in forms]
    assert {im.size for im in images} == {(56, 56)}
    assert len({im.tobytes() for im in images}) == 1
    assert images[0].getpixel((10, 10)) == (220, 30, 30) and images[0].getpixel((40, 10)) == (0, 0, 0)


@pytest.mark.parametrize(
    "ref,text",
    [
        ("missing.png", "no such image file: missing.png"),
        ("data:image/png," + "A" * 80, "a data URL without ';base64'"),
        ("data:image/png;base64,!!!notbase64", "not valid base64"),
        ("", "a non-empty string"),
    ],
)
def test_a_reference_that_names_no_image_says_why(ref, text):
    with pytest.raises(ImageError, match=text):
        load_image(ref)


def test_bytes_that_are_no_image_are_named(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("not an image at all")
    with pytest.raises(ImageError, match="is not an image PIL can read"):
        image_size(str(path), verify=True)
    blob = "data:image/png;base64," + base64.b64encode(b"\x89PNG garbage" * 8).decode()
    with pytest.raises(ImageError, match="is not an image PIL can read"):
        load_image(blob)


def test_each_image_pad_is_repeated_by_its_image_token_count():
    assert expand_image_pads([1, 9, 2, 9, 3], [2, 3], image_pad=9) == [1, 9, 9, 2, 9, 9, 9, 3]
    with pytest.raises(ValueError, match="holds 1 image placeholders for 2 images"):
        expand_image_pads([1, 9], [2, 3], image_pad=9)


@pytest.mark.parametrize("size", [(56, 56), (112, 56), (30, 200), (400, 300)])
def test_the_token_count_from_the_size_is_the_processors(tiny_vlm_dir, tmp_path, size):
    """Counted from the header alone, as transformers' image processor grids the pixels it makes."""
    path = tmp_path / "x.png"
    Image.new("RGB", size, (5, 6, 7)).save(path)
    prompt_images = PromptImages.of_checkpoint(tiny_vlm_dir)
    pixels = pixel_inputs(tiny_vlm_dir, [str(path)])
    (count,) = prompt_images.tokens_per_image([str(path)])
    assert count == pixels.tokens_per_image(prompt_images.tokens.merge)[0]
    assert 4 <= count <= 16  # the tiny processor's 56² to 112² pixels


def test_a_text_checkpoint_has_no_image_tokens(tiny_model_dir, tiny_vlm_dir):
    assert ImageTokens.of_checkpoint(tiny_model_dir) is None and PromptImages.of_checkpoint(tiny_model_dir) is None
    tokens = ImageTokens.of_checkpoint(tiny_vlm_dir)
    assert (tokens.image_pad, tokens.vision_start, tokens.merge) == (82, 80, 2)


def test_the_sample_log_shortens_embedded_images_and_keeps_paths():
    url = encode_png(Image.new("RGB", (64, 64), (1, 2, 3)))
    sample = Sample(index=0, tokens=[1, 2], images=[url, "/data/a.png"], routed_experts="AAAA")
    (record,) = sample_preview([sample], rollout_id=3, count=4)
    assert record["images"] == [f"{url[:60]}... ({len(url)} characters)", "/data/a.png"]
    assert "routed_experts" not in record and record["rollout_step"] == 3 and sample.images[0] == url
