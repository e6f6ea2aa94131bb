"""API keys of the front: where they come from and the one comparison that checks them.

Keys are on whenever the front listens beyond loopback (auth: auto), so a front opened
to the network is never open to everyone by accident. The user gives keys (a file, one
per line, or NEURONSERVE_API_KEY); with none given, one is generated into a 0600 file
in the run directory and its path, never the key, is what gets printed.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from ...processes import private_dir
from ...spec import FrontSection, MultiModelSection

log = logging.getLogger(__name__)

ENV_KEY = "NEURONSERVE_API_KEY"
GENERATED_KEY_FILE = "api_key"
ENV_ADMIN_KEY = "NEURONSERVE_ADMIN_KEY"
GENERATED_ADMIN_KEY_FILE = "admin_key"


class KeyFileError(RuntimeError):
    """A key file cannot be used (missing, empty, or writable by others)."""


@dataclass(frozen=True)
class Keys:
    values: tuple[bytes, ...]
    # where the keys are, for the messages (a file path or the variable's name)
    where: str

    def accepts(self, authorization: bytes | None) -> bool:
        """Whether an `Authorization: Bearer <key>` header holds one of the keys. Every
        key is compared, each in constant time, so the answer's timing tells nothing
        about which key (or how much of one) matched."""
        if not authorization:
            return False
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        matched = False
        for key in self.values:
            matched |= hmac.compare_digest(token, key)
        return matched


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def resolve_keys(front: FrontSection, sagemaker: bool = False) -> Keys | None:
    """The keys the front requires, or None when it takes requests without one.

    SageMaker's contract has no key (the endpoint is reached through AWS's own
    authenticated API), so its mode never asks for one."""
    if sagemaker or front.auth == "off":
        return None
    given = _given_keys(ENV_KEY, front.api_key_file)
    if given is not None:
        return given
    if front.auth == "auto" and is_loopback(front.address):
        return None
    path = Path(front.run_dir).resolve() / GENERATED_KEY_FILE
    return Keys((generated_key(path),), str(path))


def resolve_admin_keys(
    front: FrontSection, multi_model: MultiModelSection, sagemaker: bool = False
) -> Keys | None:
    """The keys of the model management routes (multi-model): none under SageMaker, whose
    own agent calls them; elsewhere always one (NEURONSERVE_ADMIN_KEY, admin_key_file, or
    one generated into <front_run_dir>/admin_key), even on loopback, since loading a model
    reads files of this host."""
    if sagemaker or not multi_model.enabled:
        return None
    given = _given_keys(ENV_ADMIN_KEY, multi_model.admin_key_file)
    if given is not None:
        return given
    path = Path(front.run_dir).resolve() / GENERATED_ADMIN_KEY_FILE
    return Keys((generated_key(path),), str(path))


def _given_keys(variable: str, key_file: Path | None) -> Keys | None:
    """The keys given in the environment `variable` and in `key_file`, or None."""
    given: list[bytes] = []
    where: list[str] = []
    env = os.environ.get(variable, "").strip()
    if env:
        given.append(env.encode())
        where.append(f"${variable}")
    if key_file is not None:
        given.extend(read_key_file(Path(key_file)))
        where.append(str(key_file))
    return Keys(tuple(given), " and ".join(where)) if given else None


def read_key_file(path: Path) -> list[bytes]:
    try:
        text = path.read_text()
    except OSError as e:
        raise KeyFileError(f"API key file {path} cannot be read: {e.strerror}") from None
    if path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(f"API key file {path} is writable by other users: chmod 600 it")
    if path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("API key file %s is readable by other users: chmod 600 it", path)
    keys = [line.strip().encode() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith(b"#")]
    if not keys:
        raise KeyFileError(f"API key file {path} holds no key (one per line)")
    return keys


def generated_key(path: Path) -> bytes:
    """The key in `path`, written there first (0600, never through a symlink) if absent."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise KeyFileError(
                f"{path} is not a key file neuronserve wrote (a symlink, another user's, or "
                "open to other users): remove it and start again"
            ) from None
        return read_key_file(path)[0]
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return read_key_file(path)[0]
