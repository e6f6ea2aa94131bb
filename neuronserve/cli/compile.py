"""neuronserve compile: a Hugging Face model directory -> an artifact for one target."""

from __future__ import annotations

import typer

from ..spec import DeploySpec
from .options import fail
from .spec_options import TOP, spec_command


@spec_command(TOP, "compile", "accuracy", skip=("deployment_name",))
def compile_cmd(spec: DeploySpec) -> None:
    """Compile a model for a target over a bucket grid, validating every bucket against
    the eager model; prints the precision, its accuracy and each bucket's check. A
    compile of the same model and options is kept in the artifact cache
    (~/.cache/neuronserve, NEURONSERVE_CACHE) and copied from there the next time."""
    from ..compile import CompileError
    from ..compile.cache import compiled_to
    from ..compile.driver import describe
    from ..compile.job import CompileJob

    try:
        path = compiled_to(CompileJob.of(spec), log=typer.echo)
    except (CompileError, ValueError, OSError) as e:
        fail(str(e), 1)
    typer.echo(describe(path))
    typer.echo(f"artifact written to {path}")
