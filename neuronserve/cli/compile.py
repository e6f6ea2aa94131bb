"""neuronserve compile: a Hugging Face model directory -> an artifact for one target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import Name, SpecFile, Truncation, fail, ints, load, spec_option


def compile_cmd(
    spec: SpecFile = None,
    model: Annotated[Path | None, spec_option("model")] = None,
    task: Annotated[str | None, spec_option("task")] = None,
    target: Annotated[str | None, spec_option("target")] = None,
    batch_sizes: Annotated[str | None, spec_option("batch_sizes")] = None,
    sequence_lengths: Annotated[str | None, spec_option("sequence_lengths")] = None,
    out: Annotated[Path | None, spec_option("artifact", "--out")] = None,
    name: Name = None,
    pooling: Annotated[str | None, spec_option("pooling")] = None,
    normalize: Annotated[
        bool | None, spec_option("normalize", "--normalize/--no-normalize")
    ] = None,
    token_embeddings: Annotated[
        bool | None, spec_option("token_embeddings", "--token-embeddings/--pooled-only")
    ] = None,
    truncation: Truncation = None,
    allow_pickle_weights: Annotated[
        bool | None,
        spec_option("allow_pickle_weights", "--allow-pickle-weights/--safetensors-only"),
    ] = None,
    tolerance: Annotated[float | None, spec_option("tolerance")] = None,
    precision: Annotated[str | None, spec_option("precision")] = None,
    module_format: Annotated[str | None, spec_option("module_format")] = None,
    min_cosine: Annotated[float | None, spec_option("min_cosine")] = None,
    min_argmax_agreement: Annotated[float | None, spec_option("min_argmax_agreement")] = None,
    min_spearman: Annotated[float | None, spec_option("min_spearman")] = None,
    min_span_agreement: Annotated[float | None, spec_option("min_span_agreement")] = None,
    min_top1_agreement: Annotated[float | None, spec_option("min_top1_agreement")] = None,
    max_top_k: Annotated[int | None, spec_option("max_top_k")] = None,
    relevance_label: Annotated[str | None, spec_option("relevance_label")] = None,
    auto_cast: Annotated[str | None, spec_option("auto_cast")] = None,
    auto_cast_type: Annotated[str | None, spec_option("auto_cast_type")] = None,
    optlevel: Annotated[int | None, spec_option("optlevel")] = None,
    compiler_arg: Annotated[
        list[str] | None, spec_option("compiler_args", "--compiler-arg")
    ] = None,
    pipeline_cores: Annotated[str | None, spec_option("pipeline_cores")] = None,
    compile_for: Annotated[str | None, spec_option("compile_for")] = None,
    compiler_workdir: Annotated[Path | None, spec_option("compiler_workdir")] = None,
) -> None:
    """Compile a model for a target over a bucket grid, validating every bucket against
    the eager model; prints the precision, its accuracy and each bucket's check."""
    # long: typer declares one parameter per command-line option
    from ..compile import CompileError, compile_model
    from ..compile.driver import describe

    s = load(
        spec,
        model=model,
        task=task,
        target=target,
        batch_sizes=ints(batch_sizes),
        sequence_lengths=ints(sequence_lengths),
        artifact=out,
        name=name,
        pooling=pooling,
        normalize=normalize,
        token_embeddings=token_embeddings,
        truncation=truncation,
        allow_pickle_weights=allow_pickle_weights,
        tolerance=tolerance,
        precision=precision,
        module_format=module_format,
        min_cosine=min_cosine,
        min_argmax_agreement=min_argmax_agreement,
        min_spearman=min_spearman,
        min_span_agreement=min_span_agreement,
        min_top1_agreement=min_top1_agreement,
        max_top_k=max_top_k,
        relevance_label=relevance_label,
        auto_cast=auto_cast,
        auto_cast_type=auto_cast_type,
        optlevel=optlevel,
        compiler_args=compiler_arg,
        pipeline_cores=(
            int(pipeline_cores) if pipeline_cores and pipeline_cores.isdigit() else pipeline_cores
        ),
        compile_for=compile_for,
        compiler_workdir=compiler_workdir,
    )
    try:
        path = compile_model(s)
    except (CompileError, ValueError, OSError) as e:
        fail(str(e), 1)
    typer.echo(describe(path))
    typer.echo(f"artifact written to {path}")
