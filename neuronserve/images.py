"""Images in, pixel rows out: request bodies decoded to images (raw JPEG/PNG/WebP bytes,
multipart uploads, JSON with base64), opened with Pillow, and the whole batch turned into
`pixel_values` by the model's own image processor from transformers (resize, crop,
rescale, normalize as its preprocessor_config.json says) in one call.

Images are opened the way transformers' pipelines open them (`load_image`: EXIF
orientation applied, then RGB, so RGBA, L, P and CMYK images all work), so what is
served is what the `image-classification` pipeline computes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

import numpy as np

from .tasks.base import RequestError

PROCESSOR_FILE = "preprocessor_config.json"
# Most pixels an image may have, read from its header before it is decoded: a PNG of one
# colour at 9400x9400 is 85 KB on the wire and 1.2 GB decoded (Pillow only warns below
# 179 Mpx). 40 Mpx holds a 7300x5500 photo.
MAX_IMAGE_PIXELS = 40_000_000


def image_shape(processor: Any) -> tuple[int, int, int]:
    """(channels, height, width) of the processor's output: its crop when it crops, else
    its resize."""
    size = (
        getattr(processor, "crop_size", None)
        if getattr(processor, "do_center_crop", False)
        else None
    )
    size = size or processor.size
    get = size.get if isinstance(size, dict) else (lambda k, d=None: getattr(size, k, d))
    height, width = get("height"), get("width")
    if height is None or width is None:
        edge = get("shortest_edge")
        if edge is None:
            raise ValueError(f"cannot tell the image size from the processor's size {size}")
        height = width = edge
    return 3, int(height), int(width)


@dataclass
class PixelRow:
    """One image as the execution path takes it (the image's stand-in for Encoded)."""

    pixels: np.ndarray

    def row(self) -> dict[str, np.ndarray]:
        return {"pixel_values": self.pixels}


class ImagePreprocessor:
    """The artifact's image processor, run on whole batches."""

    def __init__(self, folder: Path):
        from transformers import AutoImageProcessor

        # Pillow, whether or not torchvision is installed: one backend, the same answers
        self.processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
        self.shape = image_shape(self.processor)

    @classmethod
    def verified(cls, artifact: Path, manifest: Any) -> ImagePreprocessor:
        """The artifact's image processor, loaded by transformers from a private copy of
        the bytes checked against the manifest (transformers reads a folder: reading the
        artifact's own after the check would leave a window to swap the file)."""
        import tempfile

        from .artifact import read_verified

        with tempfile.TemporaryDirectory(prefix="ns-processor-") as tmp:
            for name in (manifest.image.file, "config.json"):
                if name in manifest.files:
                    (Path(tmp) / Path(name).name).write_bytes(
                        read_verified(artifact, manifest, name)
                    )
            return cls(Path(tmp))

    def pixels(self, images: Sequence[Any]) -> np.ndarray:
        """(n, channels, height, width) float32 for PIL images, in one processor call."""
        out = self.processor(images=list(images), return_tensors="np")["pixel_values"]
        return np.asarray(out, dtype=np.float32)

    def rows(self, payloads: Sequence[bytes]) -> list[PixelRow]:
        """Each image decoded and turned into pixels before the next is opened, so at
        most one decoded image is held at a time (the processor treats each image of a
        batch alone: the rows are the same)."""
        return [PixelRow(self.pixels([open_image(b, i)])[0]) for i, b in enumerate(payloads)]


def open_image(data: bytes, index: int = 0) -> Any:
    """A PIL image in RGB from encoded bytes, or a 4xx naming what is wrong."""
    from PIL import Image
    from transformers.image_utils import load_image

    with _unreadable(index):
        image = Image.open(io.BytesIO(data))  # the header only
    pixels = image.width * image.height
    if pixels > MAX_IMAGE_PIXELS:
        raise RequestError(
            f"image {index} is {image.width}x{image.height} ({pixels:,} pixels); this "
            f"server decodes at most {MAX_IMAGE_PIXELS:,}: send a smaller image",
            status=413,
        )
    with _unreadable(index):
        image.load()
    return load_image(image)


@contextlib.contextmanager
def _unreadable(index: int) -> Iterator[None]:
    """Pillow's errors reading image `index`, as the 400 that names what is wrong."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except UnidentifiedImageError:
        raise RequestError(
            f"image {index} is not an image Pillow can read (JPEG, PNG, WebP, GIF, BMP, TIFF)"
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(f"image {index} cannot be read: {e}") from None


def decode_images(
    body: Any, content_type: str | None, max_depth: int = 32
) -> tuple[Any, dict[str, Any]]:
    """(images, parameters) of a request body: one image's raw bytes (any image/* type,
    or bytes that are not JSON), a multipart form (each file field an image, a field
    named "parameters" holding JSON), or JSON {"inputs": base64 | [base64, ...],
    "parameters": {...}} (data: URLs too). Images are bytes, or a list of them."""
    from .tasks.base import decode_payload

    kind = (content_type or "").split(";")[0].strip().lower()
    if isinstance(body, dict) and "inputs" not in body:
        return _form_fields(body)  # TorchServe hands a multipart form over as fields
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body)
        if kind == "multipart/form-data":
            return _multipart(body, content_type or "")
        if kind != "application/json" and body.lstrip()[:1] not in (b"{", b"["):
            if not body:
                raise RequestError("empty request body: send an image")
            return body, {}
    inputs, parameters = decode_payload(body, content_type, max_depth)
    if isinstance(inputs, list):
        if not inputs:
            raise RequestError('"inputs" is an empty list: send at least one image')
        return [_base64(x, f"inputs[{i}]") for i, x in enumerate(inputs)], parameters
    return _base64(inputs, "inputs"), parameters


def _base64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise RequestError(
            f"{where} must be a base64 string of an image, got {type(value).__name__}"
        )
    if value.startswith("data:"):
        value = value.split(",", 1)[-1]
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where} is not valid base64") from None


def _form_fields(fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    images = [
        bytes(v)
        for k, v in fields.items()
        if k != "parameters" and isinstance(v, (bytes, bytearray))
    ]
    return _form(images, fields.get("parameters"))


def _multipart(body: bytes, content_type: str) -> tuple[Any, dict[str, Any]]:
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise RequestError("multipart body without parts (is the boundary right?)")
    images: list[bytes] = []
    parameters = None
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        payload = payload if isinstance(payload, bytes) else b""
        if part.get_param("name", header="content-disposition") == "parameters":
            parameters = payload
        else:
            images.append(payload)
    return _form(images, parameters)


def _form(images: list[bytes], parameters: Any) -> tuple[Any, dict[str, Any]]:
    if not images:
        raise RequestError("multipart request without an image: send each image as a file field")
    params: Any = {}
    if parameters:
        try:
            params = json.loads(parameters)
        except (ValueError, UnicodeDecodeError):
            raise RequestError('the "parameters" field must hold a JSON object') from None
        if not isinstance(params, dict):
            raise RequestError('the "parameters" field must hold a JSON object')
    return (images[0] if len(images) == 1 else images), params


def sample_images(count: int, seed: int = 0) -> list[bytes]:
    """Encoded images of several sizes, modes and formats (what compile checks and
    times image models on): gradients with noise, so every pixel differs."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(224, 224), (640, 480), (97, 311), (32, 32), (500, 375)]
    # each mode in a format that holds it: JPEG (RGB, CMYK), PNG (RGBA, P), WebP (L as RGB)
    kinds = [("RGB", "JPEG"), ("RGBA", "PNG"), ("L", "WEBP"), ("CMYK", "JPEG"), ("P", "PNG")]
    out = []
    for i in range(count):
        w, h = sizes[i % len(sizes)]
        x = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.2, 1, h)[:, None, None]
        pixels = np.clip(x + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        mode, fmt = kinds[i % len(kinds)]
        image = Image.fromarray(pixels, "RGB").convert(mode)
        buf = io.BytesIO()
        image.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out
