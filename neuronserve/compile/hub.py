"""A model as a user names it: a Hugging Face Hub id (`org/name`, `org/name@revision`) or a
local folder, made a local model folder; and the task its config says it was trained for.

Downloads go through huggingface_hub, so its settings hold as users know them: HF_TOKEN
(or `hf auth login`) for private and gated models, HF_HOME / HF_HUB_CACHE for where the
files go, HF_HUB_OFFLINE=1 to use the cache alone, HF_ENDPOINT for a mirror.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..names import is_hub_id
from .errors import CompileError

# what a compile reads of a Hub repository: the config, tokenizer or image processor,
# sentence-transformers' pooling files and the weights; not other frameworks' exports
IGNORED = [
    "*.onnx", "onnx/*", "openvino/*", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.mlmodel",
    "*.mlpackage/*", "coreml/*", "tf_model*", "flax_model*", "*.gguf", "*.pt", "*.pth",
]  # fmt: skip
# pickled weights are fetched only when a compile may load them (--allow-pickle-weights)
PICKLED = ["*.bin"]


@dataclass(frozen=True)
class ModelFolder:
    """A local model folder and, when it came from the Hub, the repository and the commit
    it is a snapshot of (what a compiled artifact's cache key records)."""

    folder: Path
    repo_id: str | None = None
    revision: str | None = None

    @property
    def said(self) -> str:
        """Which model this is, for the log: a Hub snapshot or a folder."""
        if self.repo_id:
            return f"the Hugging Face Hub's {self.repo_id} at {self.revision} ({self.folder})"
        return f"the local folder {self.folder.resolve()}"

    @property
    def name(self) -> str:
        """What the model is called by default: the Hub name's last part, else the folder's."""
        return self.repo_id.rsplit("/", 1)[-1] if self.repo_id else self.folder.resolve().name


def split_revision(ref: str) -> tuple[str, str | None]:
    """`org/name@revision` -> (`org/name`, `revision`); a ref without `@`, or written as
    a path, has none."""
    if "@" in ref and is_hub_id(ref):
        model, _, revision = ref.rpartition("@")
        return model, revision or None
    return ref, None


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, read now (its constants are read once,
    on import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants.HF_HUB_OFFLINE) or value in {"1", "ON", "YES", "TRUE"}


def model_folder(
    ref: str,
    revision: str | None = None,
    allow_pickle_weights: bool = False,
    cache_dir: Path | None = None,
) -> ModelFolder:
    """The local folder of `ref`: the folder itself, or the Hub snapshot of `ref` at
    `revision` (or the revision given as `ref@revision`; default main), downloaded into
    huggingface_hub's cache unless it is there already. CompileError names what to do
    when it cannot be had."""
    ref, given = split_revision(ref)
    revision = revision or given
    if not is_hub_id(ref):
        folder = Path(ref).expanduser()
        if not folder.is_dir():
            raise CompileError(
                f"model folder {ref} does not exist (nor is it a Hugging Face Hub id, such "
                "as sentence-transformers/all-MiniLM-L6-v2)"
            )
        if revision:
            raise CompileError(f"{ref} is a local folder: a revision applies to Hub ids only")
        return ModelFolder(folder)
    try:
        return _download(ref, revision, allow_pickle_weights, cache_dir)
    except CompileError as e:
        if Path(ref).is_dir():
            raise CompileError(
                f"{e} (a folder {ref} exists here: {ref} names the Hub's model; to use the "
                f"folder, write it as a path: ./{ref})"
            ) from None
        raise


def _download(
    repo_id: str, revision: str | None, allow_pickle: bool, cache_dir: Path | None
) -> ModelFolder:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" if revision else repo_id
    local_only = offline()
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_only,
            ignore_patterns=IGNORED if allow_pickle else IGNORED + PICKLED,
            library_name="neuronserve",
        )
    except GatedRepoError:
        raise CompileError(
            f"{repo_id} is gated: accept its terms on huggingface.co, then set HF_TOKEN "
            "(or run `hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise CompileError(
            f"{repo_id} is neither a local folder nor a model on the Hugging Face Hub (or it "
            "is private: set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise CompileError(f"{repo_id} has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if local_only else "the Hub cannot be reached"
        raise CompileError(
            f"{where} is not in the Hugging Face cache ({cache_dir or _hub_cache()}) and {why}:"
            f" download it once where the Hub is reachable (`hf download {repo_id}`), or "
            "point HF_HOME at a cache that holds it"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise CompileError(f"cannot download {where} from the Hugging Face Hub: {e}") from None
    folder = Path(str(path))
    # a snapshot folder is named by its commit: the revision a cache key can trust
    return ModelFolder(folder, repo_id, folder.name)


def _hub_cache() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or str(constants.HF_HUB_CACHE)


def config_task(folder: Path) -> str:
    """The task a model folder's config says it was trained for, as `--task` names it:
    a sequence classifier with one label is a cross-encoder (rerank), with several a
    classifier; a token classifier, a question-answering model, an image classifier;
    a sentence-transformers SparseEncoder a sparse embedder; a ViT backbone an image
    embedder; anything else feature-extraction."""
    config = _json(folder / "config.json")
    architectures = [str(a) for a in config.get("architectures") or []]

    def is_a(suffix: str) -> bool:
        return any(a.endswith(suffix) for a in architectures)

    if is_a("ForSequenceClassification"):
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        return "rerank" if labels == 1 else "text-classification"
    if is_a("ForTokenClassification"):
        return "token-classification"
    if is_a("ForQuestionAnswering"):
        return "question-answering"
    if is_a("ForImageClassification"):
        return "image-classification"
    modules = _json(folder / "modules.json")
    if isinstance(modules, list) and any("Splade" in str(m.get("type")) for m in modules):
        return "sparse-embedding"
    if config.get("model_type") in {"vit", "deit", "beit", "dinov2"}:
        return "image-feature-extraction"
    return "feature-extraction"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
