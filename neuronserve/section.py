"""What a section of the deployment spec is (spec.py composes them; the packagers of
Triton's repository and TorchServe's store declare theirs in packaging/): a pydantic model
whose fields are declared once, with their command-line option (`flags`), where they had
another name in the earlier flat layout, that name, and the environment variable that
sets it in the serving container."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


def flags(
    *decls: str,
    flat: str | tuple[str, ...] | None = None,
    cli: bool = True,
    env: str | None = None,
    env_reads: str | None = None,
    hidden: bool = False,
) -> dict[str, Any]:
    """A field's command-line option (`decls`: typer's declarations, default --<name>;
    `cli` off: set in specs only), the field name(s) it had in the flat layout, when it
    was named otherwise there, and the environment variable that sets it in the serving
    container (`env`, as TEI's `#[clap(long, env)]`; `env_reads`: how its value is read
    when not as the field's own, spec.from_environment); `hidden`: an option kept only to
    refuse what it once asked for, left out of `--help`."""
    extra: dict[str, Any] = {"cli": cli}
    if hidden:
        extra["hidden"] = True
    if decls:
        extra["flags"] = list(decls)
    if flat is not None:
        extra["flat"] = [flat] if isinstance(flat, str) else list(flat)
    if env is not None:
        extra["env"] = env
    if env_reads is not None:
        extra["env_reads"] = env_reads
    return extra


def declared(info: FieldInfo) -> dict[str, Any]:
    """What `flags` declared on a field ({} for a field declared without)."""
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


class Section(BaseModel):
    """A part of the spec one consumer reads; an unknown field is an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # the key the section has in a spec file
    key: ClassVar[str]
