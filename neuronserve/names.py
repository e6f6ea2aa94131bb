"""Names that become file names: a model's name is a folder in a TorchServe store or a
Triton repository (and a .mar), so it is checked before any path is built from it. A
name like `../..` or `/srv` would otherwise point packaging, which replaces what it
finds, at folders outside the store."""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def safe_name(value: str, what: str = "model name") -> str:
    """`value` if it is a plain file name: letters, digits, `_`, `.`, `-`, starting with
    a letter or digit, at most 128 characters; otherwise ValueError naming the rule."""
    if not isinstance(value, str) or not NAME.match(value):
        raise ValueError(
            f"{what} {value!r} is not a plain name: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit, at most 128 characters (it becomes a folder "
            "name)"
        )
    return value
