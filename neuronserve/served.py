"""A served model as the front needs it, read once from its artifact: name, manifest,
the truncation it is served with, the limits its workers hold to, and its tokenizer
(for /tokenize and OpenAI's token counts)."""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__
from .tasks import Task, get_task
from .tasks.base import RequestError, RequestLimits, TaskRequest, Text, prompted
from .tokenization import TextTokenizer

if TYPE_CHECKING:
    from .artifact import Manifest
    from .quantization import Calibration


@dataclass(frozen=True)
class ServedModel:
    name: str
    manifest: Manifest
    truncation: bool
    max_text_chars: int | None
    tokenizer: TextTokenizer | None  # None for an image model
    # the name its workers hold it under, when not its own (a multi-model swap loads a new
    # version under another while the old one finishes its requests)
    key: str = ""
    # the most characters its workers read for one request (max_body_bytes)
    max_request_chars: int | None = None
    # an embedder's calibration for int8 and uint8 answers (None: it has none)
    calibration: Calibration | None = None
    # the most chunks one request asking for chunking may make (max_chunks_per_request)
    max_chunks: int | None = None

    @property
    def worker_name(self) -> str:
        return self.key or self.name

    @staticmethod
    def tokenizer_of(manifest: Manifest, artifact: Path) -> TextTokenizer | None:
        """The model's tokenizer, loaded from the bytes checked against the manifest (not
        from the file again, which could have been swapped after the check)."""
        from .artifact import read_verified

        tok = manifest.tokenizer
        if tok is None:
            return None
        text = read_verified(Path(artifact), manifest, tok.file).decode()
        return TextTokenizer(Path(artifact) / tok.file, tok.max_length, text)

    @staticmethod
    def calibration_of(manifest: Manifest, artifact: Path) -> Calibration | None:
        """The embedder's calibration embeddings, from the bytes checked against the
        manifest (None when it was compiled without them)."""
        from .artifact import read_verified
        from .quantization import Calibration

        c = manifest.calibration
        if c is None:
            return None
        data = read_verified(Path(artifact), manifest, c.file)
        return Calibration(np.load(io.BytesIO(data), allow_pickle=False))

    @property
    def task(self) -> str:
        return self.manifest.task

    @functools.cached_property
    def handler(self) -> Task:
        """Its task: how the front parses its requests and answers them."""
        return get_task(self.manifest.task)

    @functools.cached_property
    def task_info(self) -> dict[str, Any]:
        """What its task's answers read (labels, the task's settings, tokenizer facts)."""
        return self.manifest.task_info()

    @functools.cached_property
    def limits(self) -> RequestLimits:
        """What one request's texts may hold (its workers check the same)."""
        return RequestLimits(
            chars=self.max_text_chars, total_chars=self.max_request_chars, chunks=self.max_chunks
        )

    def chunks_refused(self, request: TaskRequest) -> RequestError | None:
        """The 413 for a request asking for chunking whose texts make more chunks than
        it may, counted from their lengths before any worker's work (each worker counts
        again, exactly, what it is sent)."""
        chunking = request.parameters.get("chunking")
        if not chunking or self.max_chunks is None or self.tokenizer is None:
            return None
        texts = [t for t in request.texts if isinstance(t, str)]
        return self.limits.check_chunks(self.tokenizer.chunk_count(texts, chunking["overlap"]))

    @functools.cached_property
    def max_batch(self) -> int:
        """The most texts one engine call carries: the largest compiled batch (asked of
        every request the front joins: kept, not derived from the manifest each time)."""
        return self.manifest.grid.max_batch

    def prompted(self, texts: list[Text], name: str | None) -> list[Text]:
        """`texts` with the prompt `name` (or the model's default) before each, as the
        workers put it (tasks.base.prompted)."""
        if not get_task(self.task).takes_prompts:
            return texts
        m = self.manifest
        return prompted(texts, m.prompts, m.default_prompt_name, name)

    def model_type(self) -> dict[str, Any]:
        """text-embeddings-inference's model_type: embedding (with its pooling), reranker
        (a cross-encoder) or classifier; another task under its own name."""
        m = self.manifest
        labels = m.labels or []
        classes = {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)},
        }
        if m.task in ("feature-extraction", "sparse-embedding", "image-feature-extraction"):
            return {"embedding": {"pooling": m.pooling or "cls"}}
        if m.task == "rerank" or (m.task == "text-classification" and len(labels) == 1):
            return {"reranker": classes}
        if m.task == "text-classification":
            return {"classifier": classes}
        return {m.task: classes}

    def info(self, max_in_flight: int, max_client_batch: int | None) -> dict[str, Any]:
        """text-embeddings-inference's Info fields, then neuronserve's own (the front's
        bounds: requests in flight, texts per request)."""
        m = self.manifest
        return {
            "model_id": self.name,
            "model_sha": None,
            "model_dtype": m.precision,
            "served_model_name": self.name,
            "model_type": self.model_type(),
            "max_concurrent_requests": max_in_flight,
            "max_input_length": m.grid.max_seq,
            "max_batch_tokens": m.grid.max_batch * m.grid.max_seq,
            "max_batch_requests": m.grid.max_batch,
            "max_client_batch_size": max_client_batch,
            "auto_truncate": self.truncation,
            "tokenization_workers": 1,
            "version": __version__,
            "sha": None,
            "docker_label": None,
            "task": m.task,
            "target": m.target,
            "precision": m.precision,
            "prompts": dict(m.prompts),
            "default_prompt_name": m.default_prompt_name,
            "batch_sizes": m.batch_sizes,
            "sequence_lengths": m.sequence_lengths,
            "truncation": self.truncation,
            "versions": dict(m.versions),
            **self._quantization(),
        }

    def _quantization(self) -> dict[str, Any]:
        """What an embedder answers besides float32 (embedding_type), and the calibration
        its int8 and uint8 answers are quantized by."""
        if self.task != "feature-extraction":
            return {}
        from .quantization import TYPES

        c = self.manifest.calibration
        calibration = None  # int8 and uint8 then take a request's quantization_ranges
        if c is not None:
            calibration = {"texts": c.texts, "source": c.source, "ranges": c.ranges}
        return {"embedding_types": list(TYPES), "calibration": calibration}
