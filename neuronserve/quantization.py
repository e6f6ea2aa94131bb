"""Embeddings quantized per request, as sentence-transformers' `quantize_embeddings`
gives them for the same vectors and the same calibration: int8 and uint8 with one range
per dimension (256 buckets between its minimum and maximum), binary and ubinary with one
bit per dimension, packed eight to a byte as numpy's packbits packs them (binary: each
byte less 128, as int8).

The ranges are the model's own: compile embeds a calibration set (the user's texts, or a
built-in set of varied ones) and keeps those embeddings in the artifact, pooled and not
yet normalised, with the ranges of the vectors as served by default in the manifest. A
request's vectors may be normalised otherwise or truncated (Matryoshka `dimensions`): its
ranges are then those of the calibration embeddings taken through the same steps
(`VectorForm`), so that a truncated int8 vector is quantized by the ranges of truncated
vectors. A request may give its own ranges instead."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from .tasks import RequestError
from .tasks.feature_extraction import normalized

# the types a request may ask for (sentence-transformers' precisions, Cohere's
# embedding_types with float32 for float)
EmbeddingType = Literal["float32", "int8", "uint8", "binary", "ubinary"]
TYPES: tuple[str, ...] = get_args(EmbeddingType)
CALIBRATED = ("int8", "uint8")
CALIBRATION_FILE = "calibration.npy"


@dataclass(frozen=True)
class VectorForm:
    """The steps from a model's pooled vectors to those a request is answered with:
    normalised (as the model or the request says), the first `dims` kept, normalised
    again after the cut where the route does (OpenAI's `dimensions`, TEI's `normalize`)."""

    normalize: bool
    dims: int | None = None
    again: bool = False

    def apply(self, pooled: np.ndarray) -> np.ndarray:
        out = normalized(pooled) if self.normalize else np.asarray(pooled, dtype=np.float32)
        if self.dims is None:
            return out
        out = np.ascontiguousarray(out[:, : self.dims])
        return normalized(out) if self.again else out


def ranges_of(embeddings: np.ndarray) -> np.ndarray:
    """Each dimension's (minimum, maximum) over `embeddings`: a (2, dim) array."""
    return np.vstack((np.min(embeddings, axis=0), np.max(embeddings, axis=0)))


def quantize(vectors: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """`vectors` (float32, one row each) as `kind`; `ranges` (2 x dim) for int8/uint8."""
    if kind == "float32":
        return np.asarray(vectors, dtype=np.float32)
    if kind in CALIBRATED:
        if ranges is None:
            raise ValueError(f"{kind} needs each dimension's range")
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if kind == "uint8" else (buckets - 128).astype(np.int8)
    if kind == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if kind == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    raise ValueError(f"embedding type {kind!r}: one of {', '.join(TYPES)}")


def packed(rows: np.ndarray) -> list[str]:
    """Each row's bytes, base64: little-endian float32, or one byte a value."""
    little = rows.astype(rows.dtype.newbyteorder("<"), copy=False)
    return [base64.b64encode(r.tobytes()).decode() for r in little]


class Calibration:
    """A model's calibration embeddings (pooled, not normalised) and the ranges of each
    form a request asks for, computed once per form."""

    def __init__(self, embeddings: np.ndarray):
        self.embeddings = np.asarray(embeddings, dtype=np.float32)
        # a form's ranges, computed once: a request's form is one of a few (normalised or
        # not, a handful of Matryoshka sizes), each bounded by the model's dimensions
        self._ranges: dict[VectorForm, np.ndarray] = {}

    def ranges(self, form: VectorForm) -> np.ndarray:
        found = self._ranges.get(form)
        if found is None:
            found = self._ranges[form] = ranges_of(form.apply(self.embeddings))
        return found


def typed(  # noqa: PLR0913 - the vectors, their form, and what the request asked
    vectors: np.ndarray,
    kind: str,
    form: VectorForm,
    calibration: Calibration | None,
    given: list[list[float]] | None,
    model: str,
) -> np.ndarray:
    """A request's vectors (already in `form`) as the `kind` it asked for: by its own
    ranges when it gave them (`given`), else by the model's calibration in that form; a
    422 naming what is missing or wrong (`kind` is one of TYPES: the request's schema
    checked it, once)."""
    ranges = None
    if kind in CALIBRATED:
        if given is not None:
            ranges = np.asarray(given, dtype=np.float32)
            dim = vectors.shape[1]
            if ranges.shape != (2, dim) or not np.isfinite(ranges).all():
                raise RequestError(
                    f"quantization_ranges must be two lists of {dim} finite numbers (each "
                    "dimension's minimum, then its maximum), the vectors' own dimensions",
                    status=422,
                )
        elif calibration is None:
            raise RequestError(
                f"{model} has no calibration ranges (its artifact was compiled without one, or "
                f"imported): send quantization_ranges for {kind}, ask for binary, ubinary or "
                "float32, or compile it again",
                status=422,
            )
        else:
            ranges = calibration.ranges(form)
    elif given is not None:
        raise RequestError(f"quantization_ranges apply to int8 and uint8, not {kind}", status=422)
    return quantize(vectors, kind, ranges)
