"""neuronserve sign: sign an artifact's manifest with an Ed25519 key, or make a key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import fail


def sign_cmd(
    artifact: Annotated[
        Path | None, typer.Argument(help="artifact directory to sign (its manifest.json)")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="Ed25519 private key (PEM) to sign with")] = None,
    new_key: Annotated[
        Path | None,
        typer.Option(
            help="write a new key pair into this folder (neuronserve.key, 0600, and "
            "neuronserve.pub) and stop"
        ),
    ] = None,
) -> None:
    """Sign an artifact so that a server with NEURONSERVE_PUBLIC_KEY set loads it only if
    this key signed it (the manifest holds every file's sha256, so its signature covers
    them all)."""
    from ..artifact import MANIFEST, ArtifactError, read_manifest
    from ..signing import SIGNATURE, SignatureError, sign
    from ..signing import new_key as make_key

    try:
        if new_key is not None:
            private, public = make_key(new_key)
            typer.echo(f"wrote {private} (keep it private) and {public} (give it to servers)")
            return
        if artifact is None or key is None:
            fail("give an ARTIFACT and --key, or --new-key FOLDER")
        read_manifest(artifact, signed=False)  # only an intact artifact is signed
        out = artifact / SIGNATURE
        out.write_bytes(sign((artifact / MANIFEST).read_bytes(), key))
    except (ArtifactError, SignatureError, OSError) as e:
        fail(str(e), 1)
    typer.echo(f"wrote {out}: servers with NEURONSERVE_PUBLIC_KEY=<its .pub> will load it")
