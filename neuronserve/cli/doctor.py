"""neuronserve doctor: the memory plan of a deployment, and the first-run check on a
Neuron host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..spec import DeploySpec
from .options import fail
from .spec_options import spec_command


@spec_command("worker")
def doctor_cmd(
    spec: DeploySpec,
    artifacts: Annotated[
        list[Path],
        typer.Argument(
            help="the artifact to check with (a Neuron one for the host checks), and any "
            "others served beside it"
        ),
    ],
) -> None:
    """Report each worker's memory with every given model loaded (weights, the largest
    bucket's activations, the runtime) against what a worker may use here. Then, for a
    Neuron artifact, check on an Inf2/Trn1/Inf1 host what CI cannot: which NeuronCores
    this host gives, that a worker's runtime holds only the core it leased, that padded
    batch-1 requests answer like the CPU eager model, that calls do not copy weights to
    the device, and the latency of every bucket next to the published numbers. Exits 1
    if a check fails."""
    from ..artifact import ArtifactError
    from ..doctor import run_doctor

    try:
        findings = run_doctor(artifacts[0], others=artifacts[1:], spec=spec)
    except (ArtifactError, OSError) as e:
        fail(str(e), 1)
    for f in findings:
        typer.echo(f.line())
    if any(f.status == "FAIL" for f in findings):
        raise typer.Exit(1)
