"""neuronserve bench: measure endpoints over sequence length x texts per request x
concurrency, next to the vanilla pipeline measured in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..spec import WorkerSection
from .options import fail, ints
from .spec_options import spec_command


# the workers and batching of the servers bench starts come from the spec, as for `serve`
# (their response timeout is bench's own: room for slow points; the layouts are swept)
@spec_command("worker", skip=("layout", "response_timeout_s"))
def bench_cmd(
    worker: WorkerSection,
    endpoint: Annotated[
        list[str],
        typer.Option(
            "--endpoint",
            "-e",
            help="what to measure, repeatable: front:ARTIFACT (the front's /invocations, "
            "/embed and /v1/embeddings on the same processes), sagemaker:ARTIFACT (the "
            "SageMaker entrypoint) (servers started per layout, one at a time), "
            "runner:ARTIFACT, vanilla:MODEL_DIR (transformers pipeline baseline), or a "
            "running server: sagemaker:http://HOST:PORT/invocations, or any OpenAI-style "
            "embeddings route: openai:http://HOST:PORT/v1/embeddings (infinity-emb, "
            "text-embeddings-inference). Prefix LABEL= to name it.",
        ),
    ],
    sequence_lengths: Annotated[
        str, typer.Option(help="request lengths in tokens (exact, special tokens included)")
    ] = "8,128",
    texts_per_request: Annotated[str, typer.Option(help="texts in each request")] = "1",
    concurrency: Annotated[str, typer.Option(help="concurrent clients (closed loop)")] = "1,4",
    layouts: Annotated[
        str | None,
        typer.Option(
            help="worker layouts for the servers bench starts, one after the other: "
            "throughput, latency (default: the spec's layout)"
        ),
    ] = None,
    warmup: Annotated[float, typer.Option(help="seconds of warm-up before each point")] = 2.0,
    server_warmup: Annotated[
        float,
        typer.Option(
            help="seconds of load on each server bench starts before its first point; 0 to "
            "measure a cold server"
        ),
    ] = 5.0,
    duration: Annotated[float, typer.Option(help="seconds measured per point (at least)")] = 5.0,
    min_requests: Annotated[int, typer.Option(help="requests measured per point (at least)")] = 20,
    max_duration: Annotated[
        float, typer.Option(help="stop a point after this many seconds even below --min-requests")
    ] = 60.0,
    task: Annotated[
        str | None,
        typer.Option(
            help="pipeline task for vanilla (default: from an artifact among the endpoints)"
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="tokenizer.json that counts request tokens (default: an endpoint's)"),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(help="extra HTTP header 'Name: value' (e.g. an API key), repeatable"),
    ] = None,
    generator: Annotated[
        str,
        typer.Option(
            help="what drives the HTTP points: wrk (C, one thread: its CPU share is reported), "
            "python (bench's own event loop, also for gRPC and in-process points), auto (wrk "
            "where installed)"
        ),
    ] = "auto",
    wrk: Annotated[
        bool,
        typer.Option(
            "--wrk/--no-wrk",
            help="with the python generator, cross-check one point with wrk (largest concurrency)",
        ),
    ] = True,
    wrk_seq: Annotated[
        int | None,
        typer.Option(help="sequence length of the wrk cross-check (default: the shortest)"),
    ] = None,
    out: Annotated[Path, typer.Option(help="where results.{json,csv,md} and plots go")] = Path(
        "bench-results"
    ),
    title: Annotated[str, typer.Option(help="heading of results.md")] = "neuronserve bench",
) -> None:
    """Measure endpoints over sequence length x texts per request x concurrency:
    p50/p95/p99/max latency, throughput, ratio to the vanilla pipeline, the load
    generator's own CPU use; writes CSV, JSON, markdown and PNG plots."""
    # long: typer declares one parameter per command-line option
    from ..bench.run import BenchConfig, parse_endpoint, run_bench, save
    from ..load.generator import Window

    headers = {}
    for h in header or []:
        name, sep, value = h.partition(":")
        if not sep:
            fail(f"--header {h!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    layouts = layouts or worker.layout
    bad = [x for x in layouts.split(",") if x not in ("throughput", "latency")]
    if bad:
        fail(f"--layouts: unknown {bad}; use throughput and/or latency")
    try:
        config = BenchConfig(
            endpoints=[parse_endpoint(e) for e in endpoint],
            sequence_lengths=ints(sequence_lengths) or [],
            texts_per_request=ints(texts_per_request) or [1],
            concurrency=ints(concurrency) or [1],
            layouts=layouts.split(","),
            window=Window(
                warmup_s=warmup,
                duration_s=duration,
                min_requests=min_requests,
                max_duration_s=max_duration,
            ),
            server_warmup_s=server_warmup,
            worker=worker,
            headers=headers,
            tokenizer=tokenizer,
            task=task,
            generator=generator,
            wrk=wrk,
            wrk_seq=wrk_seq,
            logs=Path(out) / "logs",
        )
        results = run_bench(config)
    except (ValueError, RuntimeError, OSError) as e:
        fail(str(e), 1)
    paths = save(results, out, title)
    typer.echo((out / "results.md").read_text())
    typer.echo("wrote " + ", ".join(str(p) for p in paths))
