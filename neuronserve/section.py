"""What a section of the deployment spec is (spec.py composes them; each engine declares
its own in engines/<engine>/section.py): a pydantic model whose fields are declared once,
with their command-line option (`flags`) and, where they had another name in the earlier
flat layout, that name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field


def flags(
    *decls: str,
    flat: str | tuple[str, ...] | None = None,
    cli: bool = True,
    env: str | None = None,
    env_reads: str | None = None,
) -> dict[str, Any]:
    """A field's command-line option (`decls`: typer's declarations, default --<name>;
    `cli` off: set in specs only), the field name(s) it had in the flat layout, when it
    was named otherwise there, and the environment variable that sets it in the serving
    container (`env`, as TEI's `#[clap(long, env)]`; `env_reads`: how its value is read
    when not as the field's own, spec.from_environment)."""
    extra: dict[str, Any] = {"cli": cli}
    if decls:
        extra["flags"] = list(decls)
    if flat is not None:
        extra["flat"] = [flat] if isinstance(flat, str) else list(flat)
    if env is not None:
        extra["env"] = env
    if env_reads is not None:
        extra["env_reads"] = env_reads
    return extra


class Section(BaseModel):
    """A part of the spec one consumer reads; an unknown field is an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # the key the section has in a spec file
    key: ClassVar[str]


# an engine section of a given class
E = TypeVar("E", bound="EngineSection")


class EngineSection(Section):
    """An engine's own section (engines/<engine>/section.py): where its store is, where
    it listens, where it keeps its run folder, and its own options."""

    # the spec field holding the folder `package` writes and `serve` starts on
    store_field: ClassVar[str]
    # the fields holding the ports it listens on (a deployment picks free ones)
    port_fields: ClassVar[tuple[str, ...]]
    # what a deployment behind the front sets (serve/deployment.py): the keys the front
    # holds, and the like
    behind_front: ClassVar[dict[str, Any]] = {}
    # what the images' entrypoint sets (serve/sagemaker.py): the container is the
    # deployment's own, every process in it runs as its one user
    in_container: ClassVar[dict[str, Any]] = {}

    bind_address: str = Field(
        "127.0.0.1",
        description="address the engine listens on",
        json_schema_extra=flags(flat="bind_address"),
    )
    # each engine's section gives its own default and description
    run_dir: Path = Field(Path(".neuronserve/engine"), description="the engine's run folder")

    @classmethod
    def missing(cls) -> str | None:
        """Why the engine cannot start on this machine, with what to install; None when
        it can. Cheap and without importing the engine: the default engine is the first
        of the registry's for which this is None."""
        return None

    @property
    def store(self) -> Path:
        return Path(getattr(self, self.store_field))

    def behind_a_front(self: E, store: Path, run_dir: Path, ports: list[int]) -> E:
        """This section for an engine a front runs: on loopback, on `ports` (one per
        `port_fields`), its store and run folder at these, and what a front turns on
        (`behind_front`: keys, and the like)."""
        return (
            self.model_validate(
                {
                    **self.model_dump(exclude_unset=True),
                    **self.behind_front,
                    "bind_address": "127.0.0.1",
                    "run_dir": run_dir,
                }
            )
            .in_store(store)
            .on_ports(ports)
        )

    def in_store(self: E, store: Path) -> E:
        """The same section with its store (what `package` writes, `serve` starts on) at
        `store`."""
        return self.model_validate({**self.model_dump(exclude_unset=True), self.store_field: store})

    def on_ports(self: E, ports: list[int]) -> E:
        """The same section listening on `ports` (one per `port_fields`)."""
        return self.model_validate(
            {
                **self.model_dump(exclude_unset=True),
                **dict(zip(self.port_fields, ports, strict=True)),
            }
        )
