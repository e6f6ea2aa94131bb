"""The inputs compile checks and times a model on, for text and for images alike: the
batches each bucket is checked on, a row that fills a bucket, and the accuracy set a
lower precision is judged on. Reference, validation and the precision search ask this,
never a tokenizer or an image processor directly."""

from __future__ import annotations

from typing import Protocol

from ..buckets import Bucket
from ..execution import Row
from ..images import ImagePreprocessor, sample_images
from ..tokenization import TextTokenizer
from .texts import VALIDATION_TEXTS, accuracy_texts, calibration_texts


class Examples(Protocol):
    def bucket_sets(self, bucket: Bucket) -> list[list[Row]]:
        """The batches of real input a bucket is checked on; the first is also the
        example a static-shape target compiles the bucket with, and holds padding."""

    def full_row(self, seq: int) -> Row:
        """One row of real input filling a bucket of `seq` (timing)."""

    def accuracy_rows(self, max_seq: int) -> list[Row]:
        """The rows a lower precision's accuracy is measured on."""

    def calibration_rows(self, max_seq: int) -> list[Row]:
        """Rows, none of them an accuracy row, that static int8 calibrates on."""


class TextExamples:
    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer

    def bucket_sets(self, bucket: Bucket) -> list[list[Row]]:
        # A trace whose example fills its bucket can bake in an "attention mask is all
        # ones" branch (XLA tracing decides Python branches on the example's values),
        # which only a padded row shows; batch-1 buckets are also checked full.
        if bucket.batch == 1:
            padded = max(3, bucket.seq - max(1, bucket.seq // 4))
            return [[self._row(0, padded)], [self._row(0, bucket.seq)]]
        # the first row fills the bucket, the others are shorter: masking and padding both
        step = max(1, bucket.seq // (2 * bucket.batch))
        return [[self._row(j, max(3, bucket.seq - j * step)) for j in range(bucket.batch)]]

    def _row(self, j: int, length: int) -> Row:
        text = VALIDATION_TEXTS[j % len(VALIDATION_TEXTS)]
        return self.tokenizer.encode_to_length(text, length).row()

    def full_row(self, seq: int) -> Row:
        return self._row(0, seq)

    def accuracy_rows(self, max_seq: int) -> list[Row]:
        return self._rows(accuracy_texts(), max_seq)

    def calibration_rows(self, max_seq: int) -> list[Row]:
        return self._rows(calibration_texts(), max_seq)

    def _rows(self, texts: list[str], max_seq: int) -> list[Row]:
        return [
            e.row() for e in self.tokenizer.encode(texts, truncate=True) if len(e.ids) <= max_seq
        ]


class ImageExamples:
    """Images of several sizes, modes (RGB, RGBA, L, CMYK, P) and formats, through the
    model's own image processor."""

    def __init__(self, preprocessor: ImagePreprocessor, count: int = 32):
        self.preprocessor, self.count = preprocessor, count
        self.rows: list[Row] = self._rows(seed=0)

    def _rows(self, seed: int) -> list[Row]:
        return [p.row() for p in self.preprocessor.rows(sample_images(self.count, seed))]

    def bucket_sets(self, bucket: Bucket) -> list[list[Row]]:
        full: list[Row] = [self.rows[j % len(self.rows)] for j in range(bucket.batch)]
        # a batch short of the bucket as well: its padding rows must not change the others
        return [full, full[: bucket.batch - 1]] if bucket.batch > 1 else [full]

    def full_row(self, seq: int) -> Row:
        return self.rows[0]

    def accuracy_rows(self, max_seq: int) -> list[Row]:
        return list(self.rows)

    def calibration_rows(self, max_seq: int) -> list[Row]:
        return self._rows(seed=1)  # other noise over the same sizes and modes
