"""Who made an artifact: an Ed25519 signature over its manifest.

The manifest holds the sha256 of every file, so signing its bytes signs the artifact;
and a module file is TorchScript, which is code, so knowing who compiled it matters as
much as knowing it was not altered. `neuronserve sign` writes manifest.sig beside the
manifest with the user's private key; with NEURONSERVE_PUBLIC_KEY set (a PEM file), every
load refuses an artifact that is unsigned or signed by another key. Keys and signatures
come from `cryptography` (pip install 'neuronserve[sign]').
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

SIGNATURE = "manifest.sig"
PUBLIC_KEY_ENV = "NEURONSERVE_PUBLIC_KEY"


class SignatureError(RuntimeError):
    pass


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError(
            "signing needs the cryptography package: pip install 'neuronserve[sign]'"
        ) from None
    return serialization, ed25519


def new_key(out: Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair: <out>/neuronserve.key (private, 0600) and .pub (PEM)."""
    serialization, ed25519 = _crypto()
    out.mkdir(parents=True, exist_ok=True)
    key = ed25519.Ed25519PrivateKey.generate()
    private, public = out / "neuronserve.key", out / "neuronserve.pub"
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def sign(manifest_bytes: bytes, private_key: Path) -> bytes:
    serialization, ed25519 = _crypto()
    key = serialization.load_pem_private_key(Path(private_key).read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{private_key} is not an Ed25519 private key")
    return base64.b64encode(key.sign(manifest_bytes)) + b"\n"


def verify(manifest_bytes: bytes, signature: bytes | None, public_key: Path, where: Path) -> None:
    """Raise SignatureError unless `signature` is `public_key`'s over `manifest_bytes`."""
    serialization, ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    key = serialization.load_pem_public_key(Path(public_key).read_bytes())
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SignatureError(f"{public_key} is not an Ed25519 public key")
    if signature is None:
        raise SignatureError(
            f"{where} is not signed ({SIGNATURE} is missing) and {PUBLIC_KEY_ENV} asks for "
            "a signature: sign it with `neuronserve sign`"
        )
    try:
        key.verify(base64.b64decode(signature.strip(), validate=True), manifest_bytes)
    except (InvalidSignature, ValueError):
        raise SignatureError(
            f"{where}: {SIGNATURE} is not a signature of this manifest by {public_key}"
        ) from None


def required_key() -> Path | None:
    value = os.environ.get(PUBLIC_KEY_ENV, "").strip()
    return Path(value) if value else None
