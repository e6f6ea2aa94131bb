"""A served model as the front needs it, read once from its artifact: name, manifest,
the truncation it is served with, the limits its workers hold to, and its tokenizer
(for /tokenize and OpenAI's token counts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...tokenization import TextTokenizer

if TYPE_CHECKING:
    from ...artifact import Manifest
    from .config import FrontConfig


@dataclass(frozen=True)
class ServedModel:
    name: str
    manifest: Manifest
    engine: str
    truncation: bool
    max_text_chars: int | None
    tokenizer: TextTokenizer | None  # None for an image model
    # the name its workers hold it under, when not its own (a multi-model swap loads a new
    # version under another while the old one finishes its requests)
    key: str = ""

    @property
    def worker_name(self) -> str:
        return self.key or self.name

    @staticmethod
    def tokenizer_of(manifest: Manifest, artifact: Path) -> TextTokenizer | None:
        """The model's tokenizer, loaded from the bytes checked against the manifest (not
        from the file again, which could have been swapped after the check)."""
        from ...artifact import read_verified

        tok = manifest.tokenizer
        if tok is None:
            return None
        text = read_verified(Path(artifact), manifest, tok.file).decode()
        return TextTokenizer(Path(artifact) / tok.file, tok.max_length, text)

    @property
    def task(self) -> str:
        return self.manifest.task

    def info(self, config: FrontConfig) -> dict[str, Any]:
        m = self.manifest
        if m.labels:
            model_type: dict[str, Any] = {
                "classifier": {"id2label": {str(i): label for i, label in enumerate(m.labels)}}
            }
        else:
            model_type = {"embedding": {"pooling": m.pooling, "normalize": m.normalize}}
        return {
            "model_id": self.name,
            "task": m.task,
            "target": m.target,
            "precision": m.precision,
            "engine": self.engine,
            "model_type": model_type,
            "batch_sizes": m.batch_sizes,
            "sequence_lengths": m.sequence_lengths,
            "max_input_length": m.grid.max_seq,
            "max_client_batch_size": config.max_client_batch,
            "max_concurrent_requests": config.max_in_flight,
            "truncation": self.truncation,
            "versions": dict(m.versions),
            "version": __version__,
        }
