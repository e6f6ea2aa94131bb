"""compile: Hugging Face model directory + spec -> self-contained artifact directory.

The same driver serves every target. A dynamic-shape target compiles once and the
module is validated at every bucket; a static-shape target compiles and validates one
module per bucket. Validation runs real tokenized text, padded by the same code the
Runner uses, through the compiled module and the eager one.
"""

from __future__ import annotations

import inspect
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .. import __version__
from ..artifact import (
    BucketValidation,
    InputSpec,
    Manifest,
    PrecisionTrial,
    TokenizerSettings,
    module_file,
    write_manifest,
)
from ..buckets import Bucket, BucketGrid, pad_batch
from ..runtime import run_rows
from ..spec import DeploySpec
from ..tasks import get_task
from ..tokenization import TextTokenizer
from . import get_target
from .base import CompileError
from .texts import VALIDATION_TEXTS, accuracy_texts

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")


def _check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise CompileError(f"model directory {model_dir} does not exist")
    if not (model_dir / "config.json").is_file():
        raise CompileError(f"{model_dir} has no config.json: is it a Hugging Face model directory?")
    weights = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("pytorch_model*.bin"))
    if not weights:
        raise CompileError(f"{model_dir} has no weights (*.safetensors or pytorch_model*.bin)")


def _save_tokenizer(model_dir: Path, out: Path) -> int:
    """Write the fast tokenizer as tokenizer.json with padding and truncation off
    (the grid decides both at serve time); return the pad token id."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001 - any loader failure means the same to the user
        raise CompileError(f"cannot load a tokenizer from {model_dir}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise CompileError(
            f"{model_dir} has no fast (Rust) tokenizer; neuronserve tokenizes whole batches "
            "with `tokenizers`. Save one with tokenizer.save_pretrained() from a fast tokenizer."
        )
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(out / "tokenizer.json"))
    return int(tok.pad_token_id if tok.pad_token_id is not None else 0)


def _input_names(model: torch.nn.Module) -> list[str]:
    params = inspect.signature(model.forward).parameters
    return [n for n in INPUT_ORDER if n in params]


def _validation_batch(tokenizer: TextTokenizer, bucket: Bucket) -> list[dict[str, list[int]]]:
    """`bucket.batch` rows of real text, the first filling the bucket, the others
    shorter, so masking and padding are both exercised."""
    step = max(1, bucket.seq // (2 * bucket.batch))
    rows = []
    for j in range(bucket.batch):
        length = max(3, bucket.seq - j * step)
        rows.append(tokenizer.encode_to_length(VALIDATION_TEXTS[j % len(VALIDATION_TEXTS)],
                                               length).row())
    return rows


def _tensors(arrays: dict[str, np.ndarray], names: list[str]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(arrays[n]) for n in names)


def compile_model(spec: DeploySpec, progress: bool = True) -> Path:
    """Compile `spec.model` for `spec.target` over the spec's bucket grid into `spec.artifact`."""
    if spec.model is None:
        raise CompileError("no model directory: pass --model or set `model` in the spec")
    if spec.artifact is None:
        raise CompileError("no output directory: pass --out or set `artifact` in the spec")
    model_dir, out = Path(spec.model), Path(spec.artifact)
    _check_model_dir(model_dir)
    task = get_task(spec.task)
    target = get_target(spec.target)
    grid = BucketGrid(tuple(spec.batch_sizes), tuple(spec.sequence_lengths))

    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise CompileError(f"{out} exists and is not an artifact; choose an empty directory")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        manifest = _compile_into(spec, model_dir, staging, task, target, grid, progress)
        write_manifest(staging, manifest)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _precisions(spec: DeploySpec, target) -> tuple[tuple[str, ...], bool]:
    """(precisions to try, whether the user named one)."""
    if spec.precision != "auto":
        return (spec.precision,), True
    return tuple(getattr(target, "auto_precisions", ("fp32",))), False


def _accuracy_rows(tokenizer: TextTokenizer, max_seq: int) -> list[dict[str, list[int]]]:
    return [e.row() for e in tokenizer.encode(accuracy_texts(), truncate=True)
            if len(e.ids) <= max_seq]


def _batch1_ms(module_for, tokenizer: TextTokenizer, grid: BucketGrid, names, pad_values,
               output_dim: int) -> float:
    """Sum over the grid's sequence lengths of the best of three batch-1 runs: what
    `precision: auto` ranks candidates by. Two warm-up calls per shape first (TorchScript
    specialises on the second)."""
    total = 0.0
    for seq in grid.sequence_lengths:
        rows = [tokenizer.encode_to_length(VALIDATION_TEXTS[0], seq).row()]
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            run_rows(module_for, rows, grid, names, pad_values, output_dim)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        total += min(times)
    return total


def _build(precision, target, eager, tokenizer, grid, names, pad_values, options, spec,
           out: Path, progress: bool):
    """Compile one precision into `out`, validate every bucket against eager; return
    (module files, per-bucket validation, output dim, loaded modules by file)."""
    options = {**options, "precision": precision, "input_names": names}

    def bucket_options(bucket: Bucket) -> dict:
        workdir = options.get("compiler_workdir")
        return {**options, "compiler_workdir": Path(workdir) / bucket.key if workdir else None}

    modules: dict[str, str] = {}
    loaded: dict[str, object] = {}
    if target.dynamic_shapes:
        largest = Bucket(grid.max_batch, grid.max_seq)
        example = _tensors(pad_batch(_validation_batch(tokenizer, largest), largest, names,
                                     pad_values), names)
        compiled = target.compile(eager, example, options)
        name = "model" + getattr(compiled, "file_suffix", target.file_suffix)
        modules["dynamic"] = name
        target.save(compiled, out / name)
        # Validate what was saved, not what is in memory.
        loaded[name] = target.load(out / name)

    results: list[BucketValidation] = []
    output_dim = None
    bar = tqdm(grid.buckets, desc=f"compile {target.name} {precision}", unit="bucket",
               disable=not progress, file=sys.stderr)
    for bucket in bar:
        bar.set_postfix_str(f"batch={bucket.batch} seq={bucket.seq}")
        rows = _validation_batch(tokenizer, bucket)
        inputs = _tensors(pad_batch(rows, bucket, names, pad_values), names)
        if not target.dynamic_shapes:
            module = target.compile(eager, inputs, bucket_options(bucket))
            modules[bucket.key] = bucket.key + target.file_suffix
            target.save(module, out / modules[bucket.key])
            module = loaded[modules[bucket.key]] = target.load(out / modules[bucket.key])
        else:
            module = loaded[modules["dynamic"]]
        with torch.no_grad():
            want = eager(*inputs).float().numpy()
            got = module(*inputs).float().numpy()
        if got.shape != want.shape:
            raise CompileError(f"bucket {bucket.key}: compiled output shape {got.shape} "
                               f"differs from eager {want.shape}")
        diff = float(np.max(np.abs(got - want)))
        if not np.all(np.isfinite(got)) or math.isnan(diff):
            raise CompileError(f"bucket {bucket.key}: the compiled module produced NaN or inf")
        # fp32 must be faithful to eager; lower precisions are judged by the task's
        # accuracy floor over many texts instead (see _compile_into).
        if precision == "fp32" and diff > spec.tolerance:
            raise CompileError(
                f"bucket {bucket.key}: compiled output differs from the eager model by {diff:.3g} "
                f"(tolerance {spec.tolerance:g}); the compiled graph is not faithful. Raise "
                "`tolerance` only if that difference is acceptable for your use."
            )
        results.append(BucketValidation(batch=bucket.batch, seq=bucket.seq, max_abs_diff=diff))
        output_dim = int(got.shape[-1])
    return modules, results, output_dim, loaded


def _compile_into(spec, model_dir, out, task, target, grid, progress) -> Manifest:
    pad_id = _save_tokenizer(model_dir, out)
    shutil.copy2(model_dir / "config.json", out / "config.json")
    tokenizer = TextTokenizer(out / "tokenizer.json", grid.max_seq)

    model = task.load_model(model_dir)
    config = model.config
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None and grid.max_seq > max_pos:
        raise CompileError(
            f"sequence length {grid.max_seq} exceeds the model's max_position_embeddings "
            f"({max_pos}); lower --sequence-lengths"
        )
    names = _input_names(model)
    wrapped = task.wrap(model, model_dir, {
        "pooling": spec.pooling, "normalize": spec.normalize, "input_names": names,
    })
    eager = wrapped.module
    pad_values = {"input_ids": pad_id}
    options = spec.compiler_options()
    precisions, named = _precisions(spec, target)

    acc_rows = _accuracy_rows(tokenizer, grid.max_seq)
    floor_field = task.accuracy_floor_field
    floor = getattr(spec, floor_field) if floor_field else None
    reference = None  # fp32 eager outputs on the accuracy texts, computed once
    trials: list[PrecisionTrial] = []
    kept: dict[str, tuple] = {}
    for precision in precisions:
        try:
            described = target.describe({**options, "precision": precision}, eager)
        except ValueError as e:
            raise CompileError(str(e)) from None
        cand = out / ".candidates" / precision
        cand.mkdir(parents=True)
        modules, results, output_dim, loaded = _build(
            precision, target, eager, tokenizer, grid, names, pad_values, options, spec, cand,
            progress)
        if reference is None:
            reference = run_rows(lambda _b: eager, acc_rows, grid, names, pad_values, output_dim)

        def module_for(bucket, modules=modules, loaded=loaded):
            return loaded[module_file(modules, bucket)]

        got = run_rows(module_for, acc_rows, grid, names, pad_values, output_dim)
        accuracy = {**task.accuracy(got, reference), "texts": len(acc_rows)}
        trial = PrecisionTrial(precision=precision, engine=described.get("engine"),
                               accuracy=accuracy, passed=True)
        value = accuracy.get(task.accuracy_metric)
        if precision != "fp32" and floor is not None and value < floor:
            trial.passed = False
            trial.reason = (f"{task.accuracy_metric} {value:.4f} against fp32 eager is under "
                            f"{floor_field} {floor:g}")
            trials.append(trial)
            shutil.rmtree(cand)
            if named:
                raise CompileError(
                    f"precision {precision} refused: {trial.reason} on {len(acc_rows)} texts. "
                    f"Use a higher precision, or lower `{floor_field}` explicitly if that "
                    "accuracy is acceptable for your use.")
            if progress:
                print(f"precision {precision}: refused, {trial.reason}", file=sys.stderr)
            continue
        if len(precisions) > 1:
            trial.batch1_ms = _batch1_ms(module_for, tokenizer, grid, names, pad_values,
                                         output_dim)
            if progress:
                print(f"precision {precision}: {task.accuracy_metric} {value:.5f}, batch-1 "
                      f"model time over the grid {trial.batch1_ms:.1f} ms", file=sys.stderr)
        trials.append(trial)
        kept[precision] = (modules, results, output_dim, described, trial)

    if not kept:
        raise CompileError("no precision met the accuracy floor: " +
                           "; ".join(f"{t.precision}: {t.reason}" for t in trials))
    precision = min(kept, key=lambda p: kept[p][4].batch1_ms or 0.0)
    modules, results, output_dim, described, chosen = kept[precision]
    for f in (out / ".candidates" / precision).iterdir():
        f.rename(out / f.name)
    shutil.rmtree(out / ".candidates")

    weights = None
    if not target.dynamic_shapes and target.weights_file:
        weights = target.weights_file
        target.save_weights(eager, out / weights)

    import tokenizers
    import transformers

    return Manifest(
        name=spec.name or Path(spec.artifact).resolve().name,
        task=task.name,
        architecture=(config.architectures or [type(model).__name__])[0],
        model_type=config.model_type,
        target=target.name,
        precision=precision,
        batch_sizes=list(grid.batch_sizes),
        sequence_lengths=list(grid.sequence_lengths),
        inputs=[InputSpec(name=n, pad_value=pad_values.get(n, 0)) for n in names],
        output_name=wrapped.output_name,
        output_dim=output_dim,
        modules=modules,
        weights=weights,
        tokenizer=TokenizerSettings(max_length=grid.max_seq, truncation=spec.truncation,
                                    pad_token_id=pad_id),
        versions={
            "neuronserve": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
        compiler={**target.versions(), **described,
                  "artifact_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())},
        tolerance=spec.tolerance,
        accuracy=chosen.accuracy,
        accuracy_floor={floor_field: floor} if floor_field else {},
        precision_trials=trials,
        validation=results,
        **wrapped.manifest_fields,
    )


def describe(path: Path) -> str:
    """The CLI's summary: precision and its accuracy, what else was tried, one line per
    bucket."""
    data = json.loads((Path(path) / "manifest.json").read_text())
    lines = [f"{data['name']}: {data['task']} ({data['architecture']}) for {data['target']}, "
             f"precision {data.get('precision', 'fp32')}"]
    for t in data.get("precision_trials", []):
        acc = ", ".join(f"{k} {v:.5g}" for k, v in t["accuracy"].items() if k != "texts")
        verdict = "kept" if t["precision"] == data.get("precision") else (
            "passed" if t["passed"] else "refused")
        speed = f", batch-1 grid time {t['batch1_ms']:.1f} ms" if t.get("batch1_ms") else ""
        lines.append(f"  {t['precision']:<5} ({t.get('engine') or '-'}) {verdict}: {acc} on "
                     f"{int(t['accuracy'].get('texts', 0))} texts vs fp32 eager{speed}")
    for v in data["validation"]:
        lines.append(f"  bucket batch={v['batch']:<3} seq={v['seq']:<4} "
                     f"max |compiled - eager| = {v['max_abs_diff']:.2e}")
    return "\n".join(lines)
