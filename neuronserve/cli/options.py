"""What every subcommand shares: options declared once with their help taken from the
spec's field descriptions (one source for the spec file and the flags), spec loading
with flags overriding the file, and the error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ..spec import DeploySpec, SpecError, load_spec


def spec_option(field: str, *decls: str) -> Any:
    """A typer option for spec field `field`, helped by the field's description."""
    return typer.Option(*decls, help=DeploySpec.model_fields[field].description)


SpecFile = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        help="deployment spec (YAML): every flag is a field of it; flags override the file",
    ),
]
ArtifactsArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="artifact directories from `neuronserve compile`: one, or several served "
        "together by the same workers, each addressed by its name (default: the spec's "
        "`artifact` or `models`)",
        show_default=False,
    ),
]
Name = Annotated[str | None, spec_option("name")]
DeploymentName = Annotated[str | None, spec_option("deployment_name")]
Layout = Annotated[str | None, spec_option("layout")]
Workers = Annotated[int | None, spec_option("workers")]
Instances = Annotated[int | None, spec_option("workers", "--instances")]
CoresPerWorker = Annotated[int | None, spec_option("cores_per_worker")]
CoresPerInstance = Annotated[int | None, spec_option("cores_per_worker", "--cores-per-instance")]
MaxBatchDelayMs = Annotated[int | None, spec_option("max_batch_delay_ms")]
Truncation = Annotated[bool | None, spec_option("truncation", "--truncation/--no-truncation")]
NeuronCores = Annotated[int | None, spec_option("neuron_cores")]
Stop = Annotated[
    bool,
    typer.Option(
        "--stop",
        help="stop the server started from the run directory and wait until its processes exit",
    ),
]


def ints(value: str | None) -> list[int] | None:
    """'1,4,8' -> [1, 4, 8]"""
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def load(path: Path | None, **flags: Any) -> DeploySpec:
    """The spec from `path` with the flags that were given (not None) on top."""
    try:
        return load_spec(path, {k: v for k, v in flags.items() if v is not None})
    except SpecError as e:
        fail(str(e))


def artifacts_given(artifacts: list[Path] | None) -> dict[str, Any]:
    """Spec fields for artifacts given on the command line: one is the spec's `artifact`,
    several its `models`."""
    if not artifacts:
        return {}
    if len(artifacts) == 1:
        return {"artifact": artifacts[0]}
    return {"models": [{"artifact": a} for a in artifacts]}


def require_artifacts(spec: DeploySpec) -> DeploySpec:
    if not spec.model_entries():
        fail(
            "no artifact: pass the artifact directory (or several), or set `artifact` "
            "(or `models`) in the spec"
        )
    return spec


def fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
