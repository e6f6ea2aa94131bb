"""What every subcommand shares beyond the spec's own options (spec_options.py): the
artifacts argument, the stop flag, the error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from ..spec import DeploySpec, ModelEntry

ArtifactsArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="artifact directories from `neuronserve compile`: one, or several served "
        "together by the same workers, each addressed by its name (default: the spec's "
        "`artifact` or `models`)",
        show_default=False,
    ),
]
Stop = Annotated[
    bool,
    typer.Option(
        "--stop",
        help="stop the server started from the run directory and wait until its processes exit",
    ),
]
Timeout = Annotated[float, typer.Option(help="seconds to wait for every worker to be ready")]


def ints(value: str | None) -> list[int] | None:
    """'1,4,8' -> [1, 4, 8]"""
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def with_artifacts(spec: DeploySpec, artifacts: list[Path] | None) -> DeploySpec:
    """`spec` with the artifacts given on the command line in place of its own: one is
    the spec's `artifact` (under the spec's `name`), several its `models`."""
    if not artifacts:
        return spec
    name = spec.name if len(artifacts) == 1 else None
    try:
        return spec.with_models([ModelEntry(artifact=a, name=name) for a in artifacts])
    except ValueError as e:
        fail(str(e))


def require_artifacts(spec: DeploySpec, target: str | None = None) -> DeploySpec:
    """`spec` with artifacts for every model it deploys: those it names by Hub id or
    folder (`models: [{model: ...}]`) compiled first, for `target` (the package's) unless
    the compile section names one, else this host's; fails when it names none."""
    if spec.model_sources():
        from ..compile import CompileError
        from ..compile.cache import resolved

        try:
            spec = resolved(spec, log=typer.echo, target=target)
        except (CompileError, ValueError, OSError) as e:
            fail(str(e), 1)
    if not spec.model_entries():
        fail(
            "no artifact: pass the artifact directory (or several), or set `artifact` "
            "(or `models`) in the spec"
        )
    return spec


def fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
