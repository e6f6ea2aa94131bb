"""neuronserve validate: run an artifact's compile-time check on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import fail


def validate_cmd(
    artifact: Annotated[Path, typer.Argument(help="artifact directory from `neuronserve compile`")],
) -> None:
    """Check every bucket module of an artifact against the eager reference stored in it,
    on this host, and record the outcome in its manifest: for Neuron artifacts compiled on
    a build host (validation pending), run once on the serving host before serving."""
    from ..artifact import ArtifactError
    from ..compile import CompileError
    from ..compile.check import validate_artifact
    from ..compile.driver import describe

    try:
        validate_artifact(artifact)
    except (CompileError, ArtifactError, OSError) as e:
        fail(str(e), 1)
    typer.echo(describe(artifact))
    typer.echo(f"{artifact}: validation passed on this host")
