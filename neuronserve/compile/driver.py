"""compile: Hugging Face model directory + spec -> self-contained artifact directory.

The same driver serves every target: it prepares what a compile works with (tokenizer,
the task's eager module, the grid), lets the precision search build and validate the
candidates (precision.py, validation.py), and writes the artifact with its manifest
into a staging folder that is renamed into place only when everything passed.
"""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..artifact import (
    MANIFEST,
    CalibrationSettings,
    ImageSettings,
    InputSpec,
    Manifest,
    TokenizerSettings,
    write_manifest,
)
from ..buckets import BucketGrid
from ..execution import InputLayout, token_rows
from ..images import PROCESSOR_FILE, ImagePreprocessor
from ..spec import TRUNCATION_AT_COMPILE
from ..targets import get_target
from ..tasks import Task, WrappedModel, get_task, task_for
from ..tokenization import TextTokenizer
from .base import CompileError
from .calibration import calibrate
from .context import CompileContext
from .examples import Examples, ImageExamples, TextExamples
from .job import CompileJob
from .precision import Choice, PrecisionSearch
from .reference import REFERENCE_FILE
from .saved import save_tokenizer, versions

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
CANDIDATES = ".candidates"


def compile_job(
    job: CompileJob, progress: bool = True, log: Callable[[str], object] | None = print
) -> Path:
    """Compile `job.compile.model` for its target over its bucket grid into `job.out`;
    `log` hears which model that is (a Hub snapshot or a folder)."""
    from .hub import model_folder
    from .optimum_export import import_export, read_export, recompile_source, refuse_unless_allowed

    if job.compile.model is None:
        raise CompileError(
            "no model: pass --model (a Hugging Face Hub id or a folder) or set `model` in "
            "the spec's compile section"
        )
    if job.out is None:
        raise CompileError("no output directory: pass --out or set `artifact` in the spec")
    c = job.compile
    model = model_folder(job.compile.model, c.revision, c.allow_pickle_weights)
    if log is not None:
        log(f"model {job.compile.model}: {model.said}")
    export = read_export(model.folder)
    if export is not None and c.recompile:
        source = recompile_source(export)
        model = model_folder(source, None, c.allow_pickle_weights)
        if log is not None:
            log(f"{export.said}: compiling its source model {source} ({model.said}) instead")
    elif export is not None:
        refuse_unless_allowed(job, export)
        if log is not None:
            log(f"{export.said}: served as it is (--recompile compiles its source model)")
        return staged(job.out, lambda staging: import_export(job, export, staging))
    model_dir = model.folder
    _check_model_dir(model_dir)
    return staged(job.out, lambda staging: _compile_into(job, model_dir, staging, progress))


def staged(out: Path, build: Callable[[Path], Manifest]) -> Path:
    """The artifact `build` writes into a staging folder (returning its manifest),
    renamed to `out` only once whole."""
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise CompileError(f"{out} exists and is not an artifact; choose an empty directory")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write_manifest(staging, build(staging))
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _check_model_dir(model_dir: Path) -> None:
    if (model_dir / MANIFEST).is_file():
        raise CompileError(
            f"{model_dir} is a neuronserve artifact (what compile writes), not a Hugging Face "
            f"model: serve it with `neuronserve serve front {model_dir}`"
        )
    if not (model_dir / "config.json").is_file():
        raise CompileError(f"{model_dir} has no config.json: is it a Hugging Face model directory?")
    weights = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("pytorch_model*.bin"))
    if not weights:
        raise CompileError(
            f"{model_dir} has no weights (*.safetensors, or pytorch_model*.bin with "
            "--allow-pickle-weights)"
        )


def _input_names(model: torch.nn.Module) -> tuple[str, ...]:
    params = inspect.signature(model.forward).parameters
    return tuple(n for n in INPUT_ORDER if n in params)


def load_for_task(task: Task, model_dir: Path) -> torch.nn.Module:
    """The task's Hugging Face model, or a CompileError naming the architecture and task
    when transformers has no head for that combination."""
    try:
        return task.load_model(model_dir)
    except (ValueError, KeyError, OSError) as e:
        config = json.loads((model_dir / "config.json").read_text())
        raise CompileError(
            f"{config.get('model_type', '?')} ({', '.join(config.get('architectures') or [])}) "
            f"cannot be compiled for {task.name}: transformers has no model for that "
            f"combination ({e})"
        ) from None


# what transformers loads in place of a pickle (transformers.utils SAFE_WEIGHTS_NAME and
# SAFE_WEIGHTS_INDEX_NAME)
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def refuse_pickle_weights(model_dir: Path, allowed: bool) -> None:
    """A .bin checkpoint is a Python pickle: loading one can run code (torch.load before
    2.6 even with weights_only, CVE-2025-32434). With the safetensors weights transformers
    looks for present (its SAFE_WEIGHTS_NAME, or the index of shards) it loads those; with
    only .bin, compile refuses unless the user opts in. Another *.safetensors file (a
    junk README.safetensors beside a pickle) is not what transformers loads."""
    if allowed or any((model_dir / name).is_file() for name in SAFE_WEIGHTS):
        return
    pickles = sorted(p.name for p in model_dir.glob("*.bin"))
    if pickles:
        raise ValueError(
            f"{model_dir} holds its weights only as {', '.join(pickles)} (Python pickle, "
            "which can run code when loaded): convert them to safetensors, or pass "
            "--allow-pickle-weights if you trust where the model came from"
        )


@dataclass
class Inputs:
    """What a model reads, prepared in the artifact: a tokenizer, or an image processor
    (whose image size is then the grid's one "sequence length")."""

    grid: BucketGrid
    examples: Examples
    pad_values: dict[str, int]
    tokenizer: TokenizerSettings | None = None
    image: ImageSettings | None = None
    # what task.wrap may need of them (mask token, ...)
    facts: dict[str, Any] = field(default_factory=dict)


def _text_inputs(job: CompileJob, model_dir: Path, out: Path) -> Inputs:
    grid = BucketGrid(tuple(job.compile.batch_sizes), tuple(job.compile.sequence_lengths))
    facts = save_tokenizer(model_dir, out)
    return Inputs(
        grid=grid,
        examples=TextExamples(TextTokenizer(out / "tokenizer.json", grid.max_seq)),
        pad_values={"input_ids": facts["pad_token_id"]},
        tokenizer=TokenizerSettings(
            max_length=grid.max_seq,
            truncation=TRUNCATION_AT_COMPILE if job.truncation is None else job.truncation,
            **facts,
        ),
        facts=facts,
    )


def _image_inputs(job: CompileJob, model_dir: Path, out: Path) -> Inputs:
    try:
        preprocessor = ImagePreprocessor(model_dir)
        preprocessor.processor.save_pretrained(out)
    except (OSError, ValueError) as e:
        raise CompileError(f"cannot load an image processor from {model_dir}: {e}") from None
    shape = preprocessor.shape
    return Inputs(
        grid=BucketGrid(tuple(job.compile.batch_sizes), (shape[1],)),
        examples=ImageExamples(preprocessor),
        pad_values={},
        image=ImageSettings(file=PROCESSOR_FILE, shape=shape),
    )


def _compile_into(job: CompileJob, model_dir: Path, out: Path, progress: bool) -> Manifest:
    try:
        task = get_task(task_for(job.compile.task, job.compile.pooling, model_dir))
    except ValueError as e:
        raise CompileError(str(e)) from None
    target = get_target(job.compile.target)
    refuse_pickle_weights(model_dir, job.compile.allow_pickle_weights)
    # the model first: a task its architecture has no head for is the error to name
    model = load_for_task(task, model_dir)
    inputs = (_image_inputs if task.images else _text_inputs)(job, model_dir, out)
    grid = inputs.grid
    shutil.copy2(model_dir / "config.json", out / "config.json")
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if not task.images and max_pos is not None and grid.max_seq > max_pos:
        raise CompileError(
            f"sequence length {grid.max_seq} exceeds the model's max_position_embeddings "
            f"({max_pos}); lower --sequence-lengths"
        )
    names = ("pixel_values",) if task.images else _input_names(model)
    wrapped = task.wrap(
        model,
        model_dir,
        {
            "pooling": job.compile.pooling,
            "normalize": job.compile.normalize,
            "token_embeddings": job.compile.token_embeddings,
            "allow_pickle_weights": job.compile.allow_pickle_weights,
            "input_names": list(names),
            "max_top_k": job.compile.max_top_k,
            "relevance_label": job.compile.relevance_label,
            **inputs.facts,
        },
    )
    ctx = CompileContext(
        job=job,
        target=target,
        task=task,
        eager=wrapped.module,
        examples=inputs.examples,
        grid=grid,
        layout=_layout(task, wrapped, names, inputs),
        options=job.compile.compiler_options(job.neuron_cores),
        progress=progress,
    )
    # a Neuron compile leases and pins one core like a worker: the runtime reserves every
    # core it sees for the process that loads a model
    with target.compiling(ctx.options):
        choice = PrecisionSearch(ctx, out / CANDIDATES).run()
    for f in choice.kept.build.folder.iterdir():
        f.rename(out / f.name)
    shutil.rmtree(out / CANDIDATES)
    choice.reference.save(out / REFERENCE_FILE)
    calibration = None
    if task.name == "feature-extraction" and isinstance(inputs.examples, TextExamples):
        normalize = bool(wrapped.manifest_fields.get("normalize"))
        calibration = calibrate(ctx, inputs.examples.tokenizer, normalize, out)
    return _manifest(ctx, wrapped, choice, out, inputs, calibration)


def _layout(
    task: Task, wrapped: WrappedModel, names: tuple[str, ...], inputs: Inputs
) -> InputLayout:
    """How the compiled modules take their rows and answer (as InputLayout.of reads it
    back from the manifest)."""
    tokens = bool(wrapped.manifest_fields.get("token_embeddings"))
    per_token, leading = token_rows(task.name, tokens)
    image_shape = inputs.image.shape if inputs.image else None
    return InputLayout(names, inputs.pad_values, per_token, image_shape, leading)


def _manifest(  # noqa: PLR0913 - what the compile made, and the embedder's calibration
    ctx: CompileContext,
    wrapped: WrappedModel,
    choice: Choice,
    out: Path,
    inputs: Inputs,
    calibration: CalibrationSettings | None = None,
) -> Manifest:
    job, grid, kept = ctx.job, ctx.grid, choice.kept
    model: Any = wrapped.module.model
    config = model.config
    floor_field = ctx.task.accuracy_floor_field
    return Manifest(
        name=job.name or Path(job.out or out).resolve().name,
        task=ctx.task.name,
        architecture=(config.architectures or [type(model).__name__])[0],
        model_type=config.model_type,
        target=ctx.target.name,
        precision=kept.described["precision"],
        batch_sizes=list(grid.batch_sizes),
        sequence_lengths=list(grid.sequence_lengths),
        inputs=[
            InputSpec(name=n, pad_value=ctx.layout.pad_values.get(n, 0)) for n in ctx.layout.names
        ],
        output_name=wrapped.output_name,
        output_dim=choice.reference.output_dim,
        modules=kept.build.modules,
        tokenizer=inputs.tokenizer,
        image=inputs.image,
        versions=versions(),
        compiler={
            **ctx.target.versions(),
            **kept.described,
            "artifact_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        },
        tolerance=job.compile.tolerance,
        accuracy=kept.trial.accuracy,
        accuracy_floor={floor_field: getattr(job.accuracy, floor_field)} if floor_field else {},
        precision_trials=choice.trials,
        bucket_ms=choice.bucket_ms,
        validation=kept.validation,
        validation_status="pending" if choice.pending else "passed",
        validation_note=choice.pending,
        calibration=calibration,
        **wrapped.manifest_fields,
    )


def describe(path: Path) -> str:
    """The CLI's summary: precision and its accuracy, what else was tried, one line per
    bucket."""
    data: dict[str, Any] = json.loads((Path(path) / MANIFEST).read_text())
    lines = [
        f"{data['name']}: {data['task']} ({data['architecture']}) for {data['target']}, "
        f"precision {data.get('precision', 'fp32')}"
    ]
    lines += _embedding_lines(data)
    if data.get("validation_status") == "imported":
        lines.append(f"  {data.get('validation_note')}")
    kept = (data.get("precision"), data.get("compiler", {}).get("module_format"))
    for t in data.get("precision_trials", []):
        acc = ", ".join(f"{k} {v:.5g}" for k, v in t["accuracy"].items() if k != "texts")
        verdict = (
            "kept"
            if (t["precision"], t.get("module_format")) == kept
            else ("passed" if t["passed"] else "refused")
        )
        speed = f", batch-1 grid time {t['batch1_ms']:.1f} ms" if t.get("batch1_ms") else ""
        head = f"  {t['precision']:<5} ({t.get('module_format') or '-'}) {verdict}"
        if not t["accuracy"]:  # not built or not checked here: the reason says why
            lines.append(f"{head}: {t.get('reason')}")
            continue
        lines.append(
            f"{head}: {acc} on {int(t['accuracy'].get('texts', 0))} texts vs fp32 eager{speed}"
        )
    for v in data["validation"]:
        lines.append(
            f"  bucket batch={v['batch']:<3} seq={v['seq']:<4} "
            f"max |compiled - eager| = {v['max_abs_diff']:.2e}"
        )
    return "\n".join(lines)


def _embedding_lines(data: dict[str, Any]) -> list[str]:
    """What an embedder's summary says of its pooling and its prompts."""
    lines = []
    if data.get("pooling"):
        lines.append(
            f"  pooling {data['pooling']}"
            + (", normalised" if data.get("normalize") else "")
            + (", and every token's vector (/embed_all)" if data.get("token_embeddings") else "")
        )
    prompts = data.get("prompts") or {}
    if prompts:
        default = data.get("default_prompt_name")
        lines.append(
            "  prompts (prompt_name): "
            + ", ".join(f"{k} {v!r}" for k, v in prompts.items())
            + (f"; default {default}" if default else "")
        )
    calibration = data.get("calibration")
    if calibration:
        lines.append(
            f"  int8/uint8 answers (embedding_type) calibrated on {calibration['texts']} texts "
            f"({calibration['source']})"
        )
    return lines
