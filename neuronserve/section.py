"""What a section of the deployment spec is (spec.py composes them; each engine declares
its own in engines/<engine>/section.py): a pydantic model whose fields are declared once,
with their command-line option (`flags`), where they had another name in the earlier
flat layout, that name, and, in an engine's section, what the field is to a deployment
(its store, a port, a value a front or a container sets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

# what an engine's section marks its fields with (flags' `marks`)
MARKS = ("role", "behind_front", "in_container")
ROLES = ("store", "port")


def flags(
    *decls: str,
    flat: str | tuple[str, ...] | None = None,
    cli: bool = True,
    env: str | None = None,
    env_reads: str | None = None,
    **marks: Any,
) -> dict[str, Any]:
    """A field's command-line option (`decls`: typer's declarations, default --<name>;
    `cli` off: set in specs only), the field name(s) it had in the flat layout, when it
    was named otherwise there, and the environment variable that sets it in the serving
    container (`env`, as TEI's `#[clap(long, env)]`; `env_reads`: how its value is read
    when not as the field's own, spec.from_environment).

    An engine's section marks its fields for the deployment (`marks`): `role` "store" (the
    folder `package` writes and `serve` starts on; exactly one) or "port" (one it listens
    on: a deployment picks free ones); `behind_front`, the value a deployment behind the
    front gives it; `in_container`, the value the images' entrypoint gives it."""
    unknown = set(marks) - set(MARKS)
    if unknown or marks.get("role", ROLES[0]) not in ROLES:
        raise TypeError(f"a field is marked with {MARKS} (role: {ROLES}), not {marks}")
    extra: dict[str, Any] = {"cli": cli, **marks}
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


# an engine section of a given class
E = TypeVar("E", bound="EngineSection")


class EngineSection(Section):
    """An engine's own section (engines/<engine>/section.py): where its store is, where
    it listens, where it keeps its run folder, and its own options; its fields say which
    is which (`flags`: `role`, `behind_front`, `in_container`)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        stores = [n for n, role in cls.marked("role").items() if role == "store"]
        if len(stores) != 1:
            raise TypeError(f"{cls.__name__} must mark one field role='store', not {stores}")

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

    @classmethod
    def marked(cls, mark: str) -> dict[str, Any]:
        """Each field whose `flags` carry `mark`, with its value there, in the order
        declared."""
        return {
            name: declared(info)[mark]
            for name, info in cls.model_fields.items()
            if mark in declared(info)
        }

    @classmethod
    def store_field(cls) -> str:
        """The field holding the folder `package` writes and `serve` starts on."""
        return next(n for n, role in cls.marked("role").items() if role == "store")

    @classmethod
    def port_fields(cls) -> tuple[str, ...]:
        """The fields holding the ports it listens on."""
        return tuple(n for n, role in cls.marked("role").items() if role == "port")

    @property
    def store(self) -> Path:
        return Path(getattr(self, self.store_field()))

    def behind_a_front(self: E, store: Path, run_dir: Path, ports: list[int]) -> E:
        """This section for an engine a front runs: on loopback, on `ports` (one per
        `port_fields`), its store and run folder at these, and what a front turns on
        (its fields marked `behind_front`: keys, and the like)."""
        return (
            self.model_validate(
                {
                    **self.model_dump(exclude_unset=True),
                    **self.marked("behind_front"),
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
        return self.model_validate(
            {**self.model_dump(exclude_unset=True), self.store_field(): store}
        )

    def on_ports(self: E, ports: list[int]) -> E:
        """The same section listening on `ports` (one per `port_fields`)."""
        return self.model_validate(
            {
                **self.model_dump(exclude_unset=True),
                **dict(zip(self.port_fields(), ports, strict=True)),
            }
        )
