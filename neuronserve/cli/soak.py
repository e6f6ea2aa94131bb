"""neuronserve soak: a long mixed run with a fault in the middle (bench/soak.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..spec import WorkerSection
from .options import fail
from .spec_options import spec_command


# the workers come from the spec, as for `serve` (their response timeout is the soak's own)
@spec_command("worker", skip=("response_timeout_s",))
def soak_cmd(  # long: typer declares one parameter per command-line option
    worker: WorkerSection,
    artifact: Annotated[
        Path, typer.Argument(help="artifact directory (answers are checked against its Runner)")
    ],
    via: Annotated[
        str,
        typer.Option(
            help="front: through `serve front`'s /invocations; sagemaker: through the "
            "SageMaker entrypoint's /invocations"
        ),
    ] = "front",
    url: Annotated[
        str | None,
        typer.Option(
            help="soak a server already running at this URL instead of starting one (no kill, "
            "no memory, nothing checked after stop)"
        ),
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="requests in all")] = 4000,
    concurrency: Annotated[int, typer.Option(min=1, help="clients at once (closed loop)")] = 32,
    malformed: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of requests broken on purpose")
    ] = 0.2,
    kill_at: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="SIGKILL one worker after this share of the requests; 0: none"
        ),
    ] = 0.4,
    seed: Annotated[int, typer.Option(help="seed of the request mix")] = 0,
    out: Annotated[Path | None, typer.Option(help="write the report as JSON here")] = None,
) -> None:
    """Serve ARTIFACT and soak it: REQUESTS requests at CONCURRENCY, a MALFORMED share of
    them broken, one worker killed at KILL_AT; report answered, wrong (checked against the
    Runner in this process), refused, failed, malformed-not-4xx, recovery time, worker
    memory, and what the stop left behind. Exits 1 when a request was answered wrong, a
    malformed one got anything but a 4xx, a valid one failed (other than 503/429 with
    Retry-After, or lost in flight on the killed worker: at most one per client), 20
    sequential requests did not succeed within 60 s of the kill, a worker's memory grew
    over 10% after warm-up, or the stop left a process, a held lease or a temporary file."""
    from ..artifact import ArtifactError
    from ..bench.soak import (
        VIAS,
        SoakOptions,
        SoakTarget,
        format_report,
        run_soak,
        soak_started,
    )
    from ..processes import ServeError

    if via not in VIAS:
        fail(f"--via {via!r}: one of {', '.join(VIAS)}")
    try:
        if url is not None:
            options = SoakOptions(requests, concurrency, malformed, None, seed)
            target = SoakTarget(label=url, url=url)
            report = run_soak(options, target, artifact)
        else:
            options = SoakOptions(requests, concurrency, malformed, kill_at or None, seed)
            report = soak_started(artifact, worker, via, options, log=typer.echo)
    except (ServeError, ArtifactError, ValueError, OSError) as e:
        fail(str(e), 1)
    typer.echo(format_report(report))
    if out is not None:
        out.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        typer.echo(f"report written to {out}")
    defects = report.defects()
    for d in defects:
        typer.secho(f"defect: {d}", fg=typer.colors.RED, err=True)
    if defects:
        raise typer.Exit(1)
