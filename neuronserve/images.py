"""Images in, pixel rows out: request bodies decoded to images (raw JPEG/PNG/WebP bytes,
multipart uploads, JSON with base64), opened with Pillow, and the whole batch turned into
`pixel_values` by the model's own image processor from transformers (resize, crop,
rescale, normalize as its preprocessor_config.json says) in one call.

Images are opened the way transformers' pipelines open them (`load_image`: EXIF
orientation applied, then RGB, so RGBA, L, P and CMYK images all work), so what is
served is what the `image-classification` pipeline computes.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RequestError

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
        # the artifact holds the processor: nothing is fetched (a worker may have no network)
        self.processor = AutoImageProcessor.from_pretrained(
            folder, backend="pil", local_files_only=True
        )
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
