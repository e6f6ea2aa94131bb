"""Command-line options generated from the spec's fields, as vLLM generates its CLI from
its config classes: a field is declared once (spec.py) and
every command that takes its section gets an option for it, with the field's
description as help and its `flags` (or --<field-name>) as the option's name. The
command receives the spec built from `--spec FILE` with the flags given on top, or
only the section it reads (a parameter named after the section's key):

    @spec_command("", "worker", "limits", "torchserve")
    def package_torchserve(spec: DeploySpec, artifacts: ArtifactsArg = None) -> None: ...

    @spec_command("worker")
    def doctor(worker: WorkerSection) -> None: ...
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ..section import declared
from ..spec import SECTIONS, DeploySpec, SpecError, load_spec

F = TypeVar("F", bound=Callable[..., Any])
SECTION_KEYS = frozenset(s.key for s in SECTIONS)
TOP = ""
SEP = "__"

SpecFile = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        help="deployment spec (YAML): every flag is a field of it; flags override the file",
    ),
]


def section_model(part: str) -> type[BaseModel]:
    """The model declaring the fields of `part`: the deployment's own ("") or a
    section's."""
    if part == TOP:
        return DeploySpec
    return next(s for s in SECTIONS if s.key == part)


def cli_fields(part: str) -> list[tuple[str, FieldInfo]]:
    """The fields of `part` that have a command-line option (`section.field`: that one)."""
    part, _, only = part.partition(".")
    model = section_model(part)
    own = [(n, f) for n, f in model.model_fields.items() if declared(f).get("cli", True)]
    if only:
        own = [(n, f) for n, f in own if n == only]
    if part == TOP:  # the sections are fields of the spec, not options
        own = [(n, f) for n, f in own if n in TOP_OPTIONS]
    return own


# the deployment's own fields that have options (its sections and `models` have none)
TOP_OPTIONS = ("name", "artifact", "deployment_name", "truncation")


def _option_type(annotation: Any) -> Any:
    """What typer parses the flag as: the field's type, or str where typer has no parser
    (choices, comma-separated lists, unions), validated by the spec."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        if len(args) == 1:
            return _option_type(args[0])
        return str
    if origin is Literal:
        return str
    if origin is list:
        return list[str] if args == [str] else str
    if annotation in (int, float, bool, str, Path):
        return annotation
    return str


def _flag_decls(name: str, info: FieldInfo, kind: Any) -> list[str]:
    decls = declared(info).get("flags")
    if decls:
        return list(decls)
    flag = "--" + name.replace("_", "-")
    return [f"{flag}/--no-{name.replace('_', '-')}"] if kind is bool else [flag]


def field_help(info: FieldInfo) -> str:
    """A field's option's help: its description, and the container's variable for it."""
    env = declared(info).get("env")
    return f"{info.description} (the container's {env})" if env else str(info.description)


def _parameter(part: str, name: str, info: FieldInfo) -> inspect.Parameter:
    kind = _option_type(info.annotation)
    option = typer.Option(
        *_flag_decls(name, info, kind),
        help=field_help(info),
        show_default=False,
        hidden=bool(declared(info).get("hidden")),
    )
    return inspect.Parameter(
        f"{part or 'spec'}{SEP}{name}",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[kind | None, option],
    )


def spec_command(*parts: str, skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give the decorated command `--spec` and one option per field of `parts` (TOP for
    the deployment's own fields, else section keys, or `key.field` for one field), except
    `skip` (field names); it gets `spec` (the file's DeploySpec, the flags on top) or the
    sections its parameters are named after, and `spec_file` if it asks (None: no file)."""

    def decorate(fn: F) -> F:
        own = inspect.signature(fn)
        # the command's own annotations, resolved (its module may defer them as strings)
        hints = get_type_hints(fn, include_extras=True)
        given = [n for n in own.parameters if n in ("spec", "spec_file") or n in SECTION_KEYS]
        kept = [
            p.replace(annotation=hints.get(n, p.annotation))
            for n, p in own.parameters.items()
            if n not in given
        ]
        generated = [
            _parameter(part.partition(".")[0], name, info)
            for part in parts
            for name, info in cli_fields(part)
            if name not in skip
        ]
        file_param = inspect.Parameter(
            "spec_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SpecFile
        )
        positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in kept if p.kind is inspect.Parameter.KEYWORD_ONLY]
        signature = own.replace(
            parameters=[
                *[p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in positional],
                *[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in keyword],
                file_param,
                *generated,
            ]
        )

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            spec_file = kwargs.pop("spec_file", None)
            fields: dict[str, Any] = {}
            for key in [k for k in kwargs if SEP in k]:
                part, name = key.split(SEP, 1)
                value = kwargs.pop(key)
                if value is None or value == []:
                    continue
                if part == "spec":
                    fields[name] = value
                else:
                    fields.setdefault(part, {})[name] = value
            spec = load(spec_file, fields)
            whole = {"spec": spec, "spec_file": spec_file}
            kwargs.update({n: whole[n] if n in whole else getattr(spec, n) for n in given})
            return fn(*args, **kwargs)

        command.__signature__ = signature  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return command  # type: ignore[return-value]

    return decorate


def load(path: Path | None, fields: dict[str, Any]) -> DeploySpec:
    """The spec from `path` with `fields` (sections of the flags given) on top."""
    from .options import fail

    try:
        return load_spec(path, fields)
    except SpecError as e:
        fail(str(e))
