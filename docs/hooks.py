"""MkDocs hooks: the reference pages are written from the code, so they cannot drift.

- `<!-- cli -->` becomes every command of the `neuronserve` typer app and its options;
- `<!-- spec-fields -->` becomes a table of every DeploySpec field (type, default, the
  field's own description, whether it reaches the engine's workers);
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
    ctx = typer.Context(command)
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="neuronserve")
    # the page has its own title; typer's starts at level 1
    return text.replace("\n# ", "\n## ").removeprefix("# ")


def _spec_table() -> str:
    from neuronserve.spec import DeploySpec

    workers = set(DeploySpec.worker_fields())
    rows = [
        "| field | type | default | reaches the workers | what it is |",
        "|---|---|---|---|---|",
    ]
    for name, f in DeploySpec.model_fields.items():
        kind = str(f.annotation).replace("typing.", "").replace("pathlib.", "").replace("|", "or")
        default = "" if f.default_factory is not None else repr(f.default)
        if f.default_factory is not None:
            default = repr(f.default_factory())
        text = (f.description or "").replace("|", "or").replace("\n", " ")
        rows.append(
            f"| `{name}` | {kind} | `{default}` | {'yes' if name in workers else ''} | {text} |"
        )
    return "\n".join(rows)


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
