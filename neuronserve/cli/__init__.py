"""The `neuronserve` command: compile, validate, tune, package, serve, bench, soak,
doctor, autoscale. One module per
subcommand; this one only puts them together.

Every command reads the same deployment spec (`--spec deploy.yaml`); flags given on the
command line override the file's fields.
"""

from __future__ import annotations

import signal
import sys

import typer

from . import autoscale, bench, compile, doctor, package, serve, sign, soak, tune, validate

app = typer.Typer(
    help="Compile Hugging Face encoders ahead of time and serve them with one pinned worker "
    "per core group: on neuronserve's own server (serve front), or in your Triton or "
    "TorchServe (package triton|torchserve).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    add_completion=False,
)
app.command("compile")(compile.compile_cmd)
app.command("validate")(validate.validate_cmd)
app.command("tune")(tune.tune_cmd)
app.command("sign")(sign.sign_cmd)
app.add_typer(package.app, name="package")
app.add_typer(serve.app, name="serve")
app.command("bench")(bench.bench_cmd)
app.command("soak")(soak.soak_cmd)
app.command("doctor")(doctor.doctor_cmd)
app.add_typer(autoscale.app, name="autoscale")


def main() -> None:
    # `kill`, `timeout` and a container's stop end a command the way Ctrl-C does: its
    # finally blocks run, so bench and soak stop the servers they started instead of
    # leaving them running on their cores (a server in the foreground sets its own)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
