"""neuronserve doctor: the memory plan of a deployment, and the first-run check on a
Neuron host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..serve.front.keys import ENV_KEY
from ..spec import WorkerSection
from .options import fail
from .spec_options import spec_command


@spec_command("worker")
def doctor_cmd(
    worker: WorkerSection,
    artifacts: Annotated[
        list[Path] | None,
        typer.Argument(
            help="the artifact to check with (a Neuron one for the host checks), and any "
            "others served beside it"
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="a running front (http://HOST:PORT, on this host): read its /metrics "
            "twice and say whether the chip or the host sets the pace, and what to change"
        ),
    ] = None,
    seconds: Annotated[float, typer.Option(help="with --url: how long to watch")] = 10.0,
    key: Annotated[
        str | None,
        typer.Option(
            envvar=ENV_KEY,
            help="with --url: the front's API key for /metrics (a command line is "
            "readable by every local user: prefer the variable)",
        ),
    ] = None,
) -> None:
    """Report each worker's memory with every given model loaded (weights, the largest
    bucket's activations, the runtime) against what a worker may use here. Then, for a
    Neuron artifact, check on an Inf2/Trn1/Inf1 host what CI cannot: which NeuronCores
    this host gives, that a worker's runtime holds only the core it leased, that padded
    batch-1 requests answer like the CPU eager model, that calls do not copy weights to
    the device, and the latency of every bucket next to the published numbers. Exits 1
    if a check fails.

    With --url, watch a running front instead: requests per second, host CPU per
    request, the NeuronCores' utilization (neuron-monitor) and the host's CPUs in use,
    and which of the chip or the host sets the pace."""
    from ..artifact import ArtifactError
    from ..doctor import run_doctor

    if url is not None:
        from ..host_load import front_pace

        try:
            for line in front_pace(url, seconds, key):
                typer.echo(line)
        except OSError as e:
            fail(str(e), 1)
        return
    if not artifacts:
        fail("name an artifact to check, or a running front with --url", 2)
        return
    try:
        findings = run_doctor(artifacts[0], others=artifacts[1:], worker=worker)
    except (ArtifactError, OSError) as e:
        fail(str(e), 1)
    for f in findings:
        typer.echo(f.line())
    if any(f.status == "FAIL" for f in findings):
        raise typer.Exit(1)
