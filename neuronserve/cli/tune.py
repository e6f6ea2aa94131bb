"""neuronserve tune: a bucket grid fitted to the traffic a server saw, or to a file of
texts, priced by the artifact's measured bucket times; --apply compiles it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..serve.front.keys import ENV_KEY
from .options import fail

if TYPE_CHECKING:
    from ..artifact import Manifest
    from ..tuning import Lengths


def tune_cmd(
    artifact: Annotated[Path, typer.Argument(help="the artifact whose grid is tuned")],
    url: Annotated[
        str | None,
        typer.Option(
            help="a running front serving it (http://HOST:PORT): the text lengths and batch "
            "sizes its /metrics recorded"
        ),
    ] = None,
    texts: Annotated[
        Path | None,
        typer.Option(help="or a file of sample texts, one request of one text per line"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="with --url: the model's served name (default: the artifact's name)"),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar=ENV_KEY,
            help="with --url: the front's API key for /metrics (a command line is readable "
            "by every local user: prefer the variable)",
        ),
    ] = None,
    buckets: Annotated[
        int | None,
        typer.Option(
            help="how many buckets may be compiled (batch sizes x sequence lengths; default: "
            "as many as the artifact has)"
        ),
    ] = None,
    max_sequence_length: Annotated[
        int | None,
        typer.Option(help="the largest sequence length (default: the artifact's largest)"),
    ] = None,
    apply: Annotated[
        Path | None,
        typer.Option(
            help="compile the proposed grid into this new artifact (the model from --source, "
            "every other option as the artifact was compiled)"
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(help="with --apply: the model compiled (a folder or a Hub id)"),
    ] = None,
) -> None:
    """Propose the sequence lengths that minimise the expected device time per request for
    the traffic a server saw (--url) or a file of texts (--texts), within a budget of
    buckets and a largest length, priced by the artifact's measured bucket times (a
    length not compiled yet is estimated from them, and said to be). Prints, for today's
    grid and the proposed one, the padded share of the tokens and the expected device
    time per text and per request; with --apply, compiles the proposed grid into a new
    artifact, to serve beside the old one or to swap in (PUT /models/NAME)."""
    # long: typer declares one parameter per command-line option
    from ..artifact import ArtifactError, read_manifest
    from ..tuning import Costs, price, propose

    try:
        m = read_manifest(artifact, verify=False)
    except (ArtifactError, OSError) as e:
        fail(str(e), 1)
    if (url is None) == (texts is None):
        fail("give the traffic: --url of a running front, or --texts FILE", 2)
    if apply is not None and not source:
        fail("--apply needs --source: the model to compile (a folder or a Hub id)", 2)
    largest = max_sequence_length or m.grid.max_seq
    most = (buckets or len(m.grid.buckets)) // len(m.batch_sizes)
    try:
        lengths, said = _lengths(m, artifact, url, texts, model or m.name, key)
        costs = Costs(m.bucket_ms, m.batch_sizes)
        today = price([s for s in m.sequence_lengths if s <= largest] or [largest], lengths, costs)
        proposed = propose(lengths, costs, most, largest)
    except (OSError, ValueError) as e:
        fail(str(e), 1)
    typer.echo(said)
    _print(m, most, largest, lengths, [("today", today), ("proposed", proposed)])
    if apply is not None:
        _apply(m, list(proposed.sequence_lengths), apply, str(source))


def _print(m: Manifest, most: int, largest: int, lengths: Lengths, grids: list) -> None:
    measured = "measured bucket times" if m.bucket_ms else "no measured times: by tokens"
    typer.echo(f"batch sizes {', '.join(map(str, m.batch_sizes))} ({measured}); at most "
               f"{most} sequence lengths, the largest {largest}")  # fmt: skip
    typer.echo(f"{'':9} {'sequence lengths':28} {'padded':>7} {'ms/text':>9} {'ms/request':>11}")
    for label, p in grids:
        note = f"  (estimated: {', '.join(map(str, p.estimated))})" if p.estimated else ""
        typer.echo(
            f"{label:9} {', '.join(map(str, p.sequence_lengths)):28} {p.padded_share:>7.1%} "
            f"{p.ms_per_text:>9.4f} {p.ms_per_request(lengths):>11.4f}{note}"
        )


def _lengths(m: Manifest, artifact: Path, url: str | None, texts: Path | None, model: str,
             key: str | None) -> tuple[Lengths, str]:  # fmt: skip
    """The traffic's lengths and batch sizes, and a line saying what they are."""
    from .. import traffic
    from ..tuning import Lengths

    max_batch = m.grid.max_batch
    if url is not None:
        from ..host_load import read_metrics

        seen = traffic.read(read_metrics(url, key), model)
        counts = {
            int(b) if b != float("inf") else 10**9: n for b, n in seen.tokens.by_bound.items() if n
        }
        rows = {
            int(b) if b != float("inf") else max_batch: n
            for b, n in seen.rows.by_bound.items()
            if n
        }
        lengths = Lengths(counts, seen.tokens.total, rows, seen.texts_per_request)
        calls, rows_each = seen.rows.count, seen.rows.total / seen.rows.count
        said = (f"traffic of {model} at {url}: {seen.tokens.count} texts in {seen.requests} "
                f"requests, {calls} device calls of {rows_each:.1f} rows on average")  # fmt: skip
        return lengths, said
    from ..served import ServedModel

    tokenizer = ServedModel.tokenizer_of(m, artifact)  # its bytes checked against `m`
    if tokenizer is None:
        raise ValueError(f"{artifact} has no tokenizer: tune sizes text models' grids")
    lines = [line for line in Path(str(texts)).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{texts} holds no text")
    found: dict[int, int] = {}
    full = [len(e.ids) for e in tokenizer.encode(lines, truncate=False, offsets=False)]
    for n in full:
        found[n] = found.get(n, 0) + 1
    # a file says nothing of the batches a server forms: priced as full batches
    said = f"{len(lines)} texts from {texts}, priced in batches of {max_batch}"
    return Lengths(found, float(sum(full)), {max_batch: 1}), said


def _apply(manifest: Manifest, seqs: list[int], out: Path, source: str) -> None:
    """Compile the proposed grid into `out`, every other option as `manifest` says the
    artifact was compiled."""
    from ..compile import CompileError
    from ..compile.cache import compiled_to
    from ..compile.driver import describe
    from ..compile.job import CompileJob
    from ..spec import load_spec

    fields = {
        "artifact": out, "model": source, "name": manifest.name, "target": manifest.target,
        "precision": manifest.precision, "batch_sizes": list(manifest.batch_sizes),
        "sequence_lengths": seqs, "truncation": manifest.truncation,
        "token_embeddings": manifest.token_embeddings,
        **({"pooling": manifest.pooling} if manifest.pooling else {}),
        **({"normalize": manifest.normalize} if manifest.normalize is not None else {}),
        **({"module_format": f} if (f := manifest.compiler.get("module_format")) else {}),
    }  # fmt: skip
    try:
        path = compiled_to(CompileJob.of(load_spec(None, fields)), log=typer.echo)
    except (CompileError, ValueError, OSError) as e:
        fail(str(e), 1)
    typer.echo(describe(path))
    typer.echo(f"artifact written to {path}: serve it beside {manifest.name}, or swap it in "
               f"(PUT /models/{manifest.name})")  # fmt: skip
