"""What every subcommand shares beyond the spec's own options (spec_options.py): the
artifacts argument, the stop flag, the error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

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


def fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
