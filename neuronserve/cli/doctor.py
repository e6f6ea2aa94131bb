"""neuronserve doctor: the first-run check on a Neuron host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import fail


def doctor_cmd(
    artifact: Annotated[Path, typer.Argument(help="a Neuron artifact to check with")],
) -> None:
    """Check on an Inf2/Trn1/Inf1 host what CI cannot: which NeuronCores this host gives,
    that a worker's runtime holds only the core it leased, that padded batch-1 requests
    answer like the CPU eager model, that calls do not copy weights to the device, and
    the latency of every bucket next to the published numbers. Exits 1 if a check fails."""
    from ..artifact import ArtifactError
    from ..doctor import run_doctor

    try:
        findings = run_doctor(artifact)
    except (ArtifactError, OSError) as e:
        fail(str(e), 1)
    for f in findings:
        typer.echo(f.line())
    if any(f.status == "FAIL" for f in findings):
        raise typer.Exit(1)
