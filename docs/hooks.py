"""MkDocs hooks: the reference pages are written from the code, so they cannot drift.

- `<!-- cli -->` becomes every command of the `neuronserve` typer app and its options;
- `<!-- spec-fields -->` becomes a table per section of the spec (each field's type,
  default, command-line option and description, from the classes that declare them);
- `<!-- http-api -->` becomes the front's routes with their request fields, from the
  OpenAPI document the front serves at /openapi.json, which is also written to the site;
- `<!-- include: FILE -->` becomes a file of the repository (BENCHMARKS.md and its
  history, which stay where the benchmark commands write them), its links to the
  committed outputs shown as the files' paths.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r"<!-- include: (\S+) -->")
LINK = re.compile(r"\[([^\]]+)\]\(([^)#]+)(#[^)]*)?\)")
# where an included file's links to pages of the site point
PAGES = {"BENCHMARKS.md": "index.md", "HISTORY.md": "history.md"}


def _include(rel: str) -> str:
    path = REPO / rel
    text = path.read_text()

    def link(m: re.Match) -> str:
        label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if target.startswith("http"):
            return m.group(0)
        name = Path(target).name
        if name in PAGES:
            return f"[{label}]({PAGES[name]}{anchor})"
        where = (path.parent / target).resolve().relative_to(REPO)
        return f"{label} (`{where}`)"

    return LINK.sub(link, text)


def _cli_reference() -> str:
    """Every command and option, as typer's own `utils docs` writes them."""
    import typer
    import typer.cli

    from neuronserve.cli import app

    command = typer.main.get_command(app)
    _drop_hidden(command)
    ctx = typer.Context(command)
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="neuronserve")
    # the page has its own title; typer's starts at level 1
    return text.replace("\n# ", "\n## ").removeprefix("# ")


def _drop_hidden(command: Any) -> None:
    """Leave out the commands kept only to refuse what they once did (`serve triton`)."""
    commands = getattr(command, "commands", None)
    if commands is None:
        return
    for name, sub in list(commands.items()):
        if sub.hidden:
            del commands[name]
        else:
            _drop_hidden(sub)


def _type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `float`, `Path or None`, `'cpu' or 'neuronx'`."""
    import types
    import typing

    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _spec_table() -> str:
    """A table per section of the spec (the deployment's own fields first), each field
    with its type, default, command-line option and flat-layout name where it differs."""
    from neuronserve.cli.spec_options import TOP, TOP_OPTIONS, cli_fields, section_model
    from neuronserve.section import declared
    from neuronserve.spec import SECTIONS

    parts = [TOP, *(s.key for s in SECTIONS)]
    out = []
    for part in parts:
        model = section_model(part)
        title = "The deployment" if part == TOP else f"`{part}:`"
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"### {title}", "", doc, ""]
        out += [
            "| field | type | default | option | what it is |",
            "|---|---|---|---|---|",
        ]
        options = {n: f for n, f in cli_fields(part)}
        for name, f in model.model_fields.items():
            if part == TOP and name not in (*TOP_OPTIONS, "models"):
                continue
            default = repr(f.default_factory() if f.default_factory is not None else f.default)
            extra = declared(f)
            flags = extra.get("flags") or (
                [f"--{name.replace('_', '-')}"] if name in options else []
            )
            flat, env = extra.get("flat"), extra.get("env")
            text = (f.description or "") + (f" (flat layout: `{', '.join(flat)}`)" if flat else "")
            text += f" (the container's `{env}`)" if env else ""
            rows = f"| `{name}` | {_cell(_type_name(f.annotation))} | `{_cell(default)}` | "
            rows += f"{_cell(', '.join(f'`{x}`' for x in flags))} | {_cell(text)} |"
            out.append(rows)
        out.append("")
    return "\n".join(out)


def _document() -> dict[str, Any]:
    from neuronserve.serve.front.openapi import document
    from neuronserve.serve.front.routes import Api, endpoints

    return document(endpoints(Api.__new__(Api)))


def _http_reference() -> str:
    doc = _document()
    schemas = doc["components"]["schemas"]
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            key = "API key (when keys are on)" if "security" in op else "no key"
            out.append(f"### `{method.upper()} {path}`\n\n{op['summary']}. {key}.\n")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                name = body["schema"]["$ref"].rsplit("/", 1)[-1]
                props = schemas[name].get("properties", {})
                required = set(schemas[name].get("required", []))
                out.append("| field | required | what it is |\n|---|---|---|")
                for field, spec in props.items():
                    text = (spec.get("description") or "").replace("|", "or")
                    out.append(f"| `{field}` | {'yes' if field in required else ''} | {text} |")
                out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- cli -->" in markdown:
        markdown = markdown.replace("<!-- cli -->", _cli_reference())
    if "<!-- spec-fields -->" in markdown:
        markdown = markdown.replace("<!-- spec-fields -->", _spec_table())
    if "<!-- http-api -->" in markdown:
        markdown = markdown.replace("<!-- http-api -->", _http_reference())
    return INCLUDE.sub(lambda m: _include(m.group(1)), markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    doc = json.dumps(_document(), indent=2)
    files.append(File.generated(config, "reference/openapi.json", content=doc))
    return files
