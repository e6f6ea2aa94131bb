"""The artifact directory: manifest read/write and integrity.

An artifact is self-contained: the compiled module(s), tokenizer files, config.json
and manifest.json, which records everything a server needs to load it (task, target,
buckets, input names, labels, tokenizer settings, versions) and a sha256 of every
other file so a changed or truncated file is refused at load, by name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from .buckets import Bucket, BucketGrid
from .names import safe_name

MANIFEST = "manifest.json"
# 2: reference.npz (eager outputs the modules are checked against), validation_status
FORMAT_VERSION = 2
# the `modules` key of the one module a dynamic-shape target compiles for every bucket
DYNAMIC = "dynamic"


class ArtifactError(RuntimeError):
    """The artifact directory is missing, incomplete or altered."""


class InputSpec(BaseModel):
    name: str
    dtype: str = "int64"
    pad_value: int = 0


class TokenizerSettings(BaseModel):
    file: str = "tokenizer.json"
    max_length: int
    truncation: bool = True
    pad_token_id: int = 0
    supports_pairs: bool = True
    # what the token-level tasks decode with, as transformers' tokenizer had them
    mask_token_id: int | None = None
    unk_token_id: int | None = None
    # transformers' clean_up_tokenization_spaces, as its decode applies it to this tokenizer
    clean_up_spaces: bool = False


class ImageSettings(BaseModel):
    """An image model's preprocessing: the transformers image processor saved in the
    artifact, and the (channels, height, width) it makes every image."""

    file: str = "preprocessor_config.json"
    shape: tuple[int, int, int]


class ExportSettings(BaseModel):
    """How a module compiled elsewhere (an optimum-neuron export, imported as it is)
    answers: a tuple whose first tensor is served, pooled on the host over the attention
    mask when `pooling` names how (its hidden states), as it is otherwise (logits)."""

    by: str
    pooling: Literal["cls", "mean"] | None = None
    # whoever compiled it imported the module with allow_exported_module: a TorchScript
    # archive runs code of its own when loaded, so a module imported without it is not
    allowed: bool = False


class CalibrationSettings(BaseModel):
    """An embedder's calibration for int8 and uint8 answers (quantization.py): its
    embeddings of the calibration texts (pooled, not normalised) in `file`, and each
    dimension's (minimum, maximum) of those embeddings as served by default."""

    file: str
    texts: int
    source: str
    ranges: list[list[float]]


class BucketValidation(BaseModel):
    batch: int
    seq: int
    max_abs_diff: float


class PrecisionTrial(BaseModel):
    """One precision `compile` tried: its accuracy against fp32 eager on the accuracy
    texts, whether it met the spec's floor, and (when several were tried) its batch-1
    model time summed over the grid's sequence lengths."""

    precision: str
    # torchscript or onnx: what the module file is, and so which library runs it
    module_format: str | None = None
    accuracy: dict[str, float] = Field(default_factory=dict)
    # None: not checked on the compile host (validation pending)
    passed: bool | None
    reason: str | None = None
    batch1_ms: float | None = None


class Manifest(BaseModel):
    format_version: int = FORMAT_VERSION
    name: str
    task: str
    architecture: str
    model_type: str
    target: str
    precision: str = "fp32"
    batch_sizes: list[int]
    sequence_lengths: list[int]
    inputs: list[InputSpec]
    output_name: str
    output_dim: int
    # bucket key -> module file; a dynamic-shape target has the single key "dynamic"
    modules: dict[str, str]
    labels: list[str] | None = None
    # cls | mean | splade (sparse-embedding)
    pooling: str | None = None
    normalize: bool | None = None
    # feature-extraction: the module answers every token's vector after the pooled one
    # ((1 + tokens) x dim per text), for /embed_all
    token_embeddings: bool = False
    # sentence-transformers' prompts (config_sentence_transformers.json): name -> text put
    # before an input, and the one applied when a request names none
    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None
    # what a task's answers need beyond the labels (fill-mask: the predictions kept per
    # token; rerank: the label scored)
    task_settings: dict[str, Any] = Field(default_factory=dict)
    # a text model's tokenizer, or an image model's processor
    tokenizer: TokenizerSettings | None = None
    image: ImageSettings | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    compiler: dict[str, Any] = Field(default_factory=dict)
    tolerance: float
    validation: list[BucketValidation] = Field(default_factory=list)
    # passed: every bucket and the accuracy were checked against reference.npz here;
    # pending: the modules cannot run on the compile host (`neuronserve validate` on the
    # serving host checks them); failed: that check refused them (validation_note says why)
    # imported: compiled elsewhere (`exported`), served as it is, unchecked here
    validation_status: Literal["passed", "pending", "failed", "imported"] = "passed"
    validation_note: str | None = None
    exported: ExportSettings | None = None
    calibration: CalibrationSettings | None = None
    # against fp32 eager on compile's accuracy texts (cosine or argmax agreement per task)
    accuracy: dict[str, float] = Field(default_factory=dict)
    accuracy_floor: dict[str, float] = Field(default_factory=dict)
    precision_trials: list[PrecisionTrial] = Field(default_factory=list)
    # bucket key -> ms of one full bucket through the kept modules on the compile host
    # (empty where they cannot run there): what the Runner sizes its bucket runs by
    bucket_ms: dict[str, float] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return safe_name(v)

    @field_validator("files", "modules")
    @classmethod
    def _inside(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        paths = v.keys() if info.field_name == "files" else v.values()
        for rel in paths:
            inside_artifact(rel)
        return v

    def opened_files(self) -> list[str]:
        """Every file the loaders open: each must be listed, and so hashed."""
        preprocessing = self.tokenizer or self.image
        files = {*self.modules.values(), *([preprocessing.file] if preprocessing else [])}
        return sorted(files | ({self.calibration.file} if self.calibration else set()))

    @property
    def truncation(self) -> bool:
        """Whether compile recorded cutting over-long text (never, for images)."""
        return self.tokenizer.truncation if self.tokenizer else False

    def task_info(self) -> dict[str, Any]:
        """What a task's respond and finish read (labels, task settings, tokenizer facts):
        the same wherever it runs, worker or front."""
        t = self.tokenizer
        return {
            "labels": self.labels,
            "output_dim": self.output_dim,
            "token_embeddings": self.token_embeddings,
            **self.task_settings,
            "mask_token_id": t.mask_token_id if t else None,
            "unk_token_id": t.unk_token_id if t else None,
            "clean_up_spaces": t.clean_up_spaces if t else False,
        }

    @property
    def grid(self) -> BucketGrid:
        return BucketGrid(tuple(self.batch_sizes), tuple(self.sequence_lengths))

    def module_for(self, bucket: Bucket) -> str:
        return module_file(self.modules, bucket)


def module_file(modules: dict[str, str], bucket: Bucket) -> str:
    """The module file serving `bucket`: its own, or the one dynamic-shape module."""
    return modules.get(bucket.key) or modules[DYNAMIC]


def inside_artifact(rel: str) -> str:
    """`rel` if it names a file inside the artifact: relative, no `..`, no backslash."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{rel!r} is not a path inside the artifact")
    return rel


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _payload_files(directory: Path) -> list[Path]:
    from .signing import SIGNATURE

    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and p.relative_to(directory).as_posix() not in (MANIFEST, SIGNATURE)
    )


def _links(directory: Path) -> list[str]:
    """Symbolic links anywhere in the artifact (rglob does not descend into linked
    folders, so a linked folder would otherwise escape the check)."""
    out = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                out.append(os.path.relpath(os.path.join(root, name), directory))
    return sorted(out)


def read_verified(directory: Path, manifest: Manifest, rel: str) -> bytes:
    """The bytes of `rel`, read once and checked against the manifest's sha256: what a
    loader gets is what was verified, not a file swapped in after the check."""
    data = (Path(directory) / inside_artifact(rel)).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.files.get(rel):
        raise ArtifactError(f"{rel} does not match its sha256 in {MANIFEST} (altered or corrupt)")
    return data


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Checksum every file in `directory` and write manifest.json beside them."""
    directory = Path(directory)
    payload = _payload_files(directory)
    manifest.files = {str(p.relative_to(directory)): sha256_file(p) for p in payload}
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest.model_dump(), indent=2) + "\n")
    # weights are the model owner's: readable by the owner and the group (the serving
    # user, in the images), not by every user of the host
    for p in [*payload, path]:
        p.chmod(0o640)
    for d in {directory, *(p.parent for p in payload)}:
        d.chmod(0o750)
    return path


def read_manifest(directory: Path, verify: bool = True, signed: bool = True) -> Manifest:
    """Load the manifest; with `verify`, refuse a missing, altered or unlisted file; with
    `signed` (and NEURONSERVE_PUBLIC_KEY set), refuse one that key did not sign."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(
            f"{directory} is not a neuronserve artifact: {MANIFEST} is missing "
            "(create one with `neuronserve compile`)"
        )
    raw = path.read_bytes()  # one read: the bytes checked are the bytes parsed
    if signed:
        _check_signature(directory, raw)
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValueError as e:
        raise ArtifactError(f"{path} is not a valid manifest: {e}") from e
    if manifest.format_version != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} has format version {manifest.format_version}; this neuronserve "
            f"reads version {FORMAT_VERSION}: recompile the model"
        )
    if verify:
        verify_files(directory, manifest)
    return manifest


def _check_signature(directory: Path, raw: bytes) -> None:
    """With NEURONSERVE_PUBLIC_KEY set, the manifest must carry that key's signature."""
    from .signing import SIGNATURE, SignatureError, required_key, verify

    key = required_key()
    if key is None:
        return
    sig_path = directory / SIGNATURE
    signature = sig_path.read_bytes() if sig_path.is_file() else None
    try:
        verify(raw, signature, key, directory)
    except SignatureError as e:
        raise ArtifactError(str(e)) from None


def verify_files(directory: Path, manifest: Manifest) -> None:
    problems = [f"{rel} is a symbolic link (refused)" for rel in _links(directory)]
    problems += [
        f"{rel} is opened by the loaders but not listed in {MANIFEST}"
        for rel in manifest.opened_files()
        if rel not in manifest.files
    ]
    for rel, expected in manifest.files.items():
        p = directory / rel
        if not p.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(p) != expected:
            problems.append(f"{rel} does not match its sha256 in {MANIFEST} (altered or corrupt)")
    for p in _payload_files(directory):
        rel = str(p.relative_to(directory))
        if rel not in manifest.files:
            problems.append(f"{rel} is not listed in {MANIFEST}")
    if problems:
        raise ArtifactError(
            f"artifact {directory} failed its integrity check:\n  "
            + "\n  ".join(problems)
            + "\nRecompile it with `neuronserve compile` or restore the original files."
        )
