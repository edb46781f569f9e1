"""An image reference as a prompt record, a sample and a `/generate` request carry it, loaded as a PIL image.

A reference is a string, in the forms SGLang's `image_data` takes: a local file path (or `file://` URL), a
`data:image/...;base64,` URL, bare base64 bytes, or an `http(s)://` URL (fetched). Torch-free: validation checks
every record's images before anything starts.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.request
from pathlib import Path

from PIL import Image, UnidentifiedImageError

FETCH_TIMEOUT_S = 30.0
_MIN_BASE64_CHARS = 64  # a shorter string without a path separator is taken for a path (and reported missing)


class ImageError(ValueError):
    """An image reference that names no readable image (the message says which form was read and why)."""


def image_bytes(ref: str) -> bytes:
    """The encoded bytes `ref` names (file, data URL, base64 or http URL)."""
    if not isinstance(ref, str) or not ref:
        raise ImageError(f"an image reference is a non-empty string (a path, URL or base64), got {ref!r}")
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            raise ImageError(f"a data URL without ';base64' ({header[:40]!r})")
        return _b64(payload)
    if ref.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(ref, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 (the record's URL)
                return response.read()
        except OSError as exc:
            raise ImageError(f"cannot fetch {ref} ({exc})") from None
    path = Path(ref.removeprefix("file://"))
    if path.is_file():
        return path.read_bytes()
    if len(ref) >= _MIN_BASE64_CHARS and "/" not in ref[:8] and not path.suffix:
        return _b64(ref)
    raise ImageError(f"no such image file: {ref}")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"not valid base64 ({exc})") from None


def load_image(ref: str) -> Image.Image:
    """The RGB image `ref` names; ImageError when it names none or the bytes are not an image."""
    data = image_bytes(ref)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"{short_reference(ref)} is not an image PIL can read ({exc})") from None
    return image.convert("RGB")


def image_size(ref: str, *, verify: bool = False) -> tuple[int, int]:
    """(width, height) in pixels of the image `ref` names, read from its header (`verify`: PIL's integrity check
    of the file too, still without decoding its pixels); ImageError when it names no image."""
    data = image_bytes(ref)
    try:
        with Image.open(io.BytesIO(data)) as image:
            size = image.size
            if verify:
                image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:  # PIL's verify raises SyntaxError for bad chunks
        raise ImageError(f"{short_reference(ref)} is not an image PIL can read ({exc})") from None
    return size


def short_reference(ref: str) -> str:
    """`ref` as a log shows it: whole up to 80 characters, else its start and its length (an embedded image's
    base64 can run to megabytes)."""
    return ref if len(ref) <= 80 else ref[:60] + f"... ({len(ref)} characters)"


def encode_png(image: Image.Image) -> str:
    """`image` as a `data:image/png;base64,` URL (a reference every reader here and SGLang take)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
