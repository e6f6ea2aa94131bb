"""Names that become file names: a model's name is a folder in a TorchServe store or a
Triton repository (and a .mar), so it is checked before any path is built from it. A
name like `../..` or `/srv` would otherwise point packaging, which replaces what it
finds, at folders outside the store. And the rule that tells a Hugging Face Hub id from
a folder. Every rule matches the whole string (`fullmatch`: a `$` would let a trailing
newline through)."""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# what a Hub id looks like (huggingface_hub's own rule: an optional namespace, a name of
# letters, digits, '-', '_', '.'), before an optional `@revision`
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?(@[^@\s]+)?", re.ASCII)


def safe_name(value: str, what: str = "model name") -> str:
    """`value` if it is a plain file name: letters, digits, `_`, `.`, `-`, starting with
    a letter or digit, at most 128 characters; otherwise ValueError naming the rule."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a plain name: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit, at most 128 characters (it becomes a folder "
            "name)"
        )
    return value


def written_as_path(ref: str) -> bool:
    """Whether a model reference is written as a path: absolute, or from ./, ../ or ~."""
    return ref in {".", ".."} or ref.startswith(("/", "./", "../", "~"))


def is_hub_id(ref: str) -> bool:
    """Whether a model reference names a Hugging Face Hub model (`org/name`, `name`,
    either with `@revision`) rather than a folder: shaped like one and not written as a
    path. A folder of that name here does not change the answer: one in the working
    directory (or planted by another user in a shared one) never stands in for the Hub's
    model; write it ./org/name to mean the folder."""
    return not written_as_path(ref) and HUB_ID.fullmatch(ref) is not None
