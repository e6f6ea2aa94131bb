"""The shape the code keeps (ruff and mypy check the rest): no function over 60 lines
unless a `# long:` comment in it says why, no import cycle between modules (counting
every import: at the top, inside functions and for type checking), and nothing outside
the engine registry asking which engine it talks to."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from helpers import REPO

LIMIT = 60


def test_functions_are_short_or_say_why():
    long = []
    for root in ("neuronserve", "handlers", "triton_backend", "scripts"):
        for path in (REPO / root).rglob("*.py"):
            source = path.read_text()
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                body = lines[node.lineno - 1 : node.end_lineno]
                if len(body) > LIMIT and not any("# long:" in line for line in body):
                    long.append(
                        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({len(body)} lines)"
                    )
    assert not long, long


def test_modules_import_alone_and_workers_start_before_torch():
    # a cycle shows up as an ImportError when the module in the middle is imported first
    # (compile/driver -> runtime -> compile was one)
    for module in ("neuronserve.compile.driver", "neuronserve.runtime"):
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)
    # the adapters lease and pin through these before anything may import torch
    code = (
        "import sys, neuronserve.worker, neuronserve.metrics; "
        "assert 'torch' not in sys.modules, 'torch imported before the pin'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_compile_model_keeps_its_signature():
    import inspect

    from neuronserve.compile import compile_model

    assert list(inspect.signature(compile_model).parameters) == ["spec", "progress"]


def _imports() -> dict[str, set[str]]:
    """Every neuronserve module -> the neuronserve modules it imports, anywhere in it."""
    root = REPO / "neuronserve"
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                where = ".".join([*base, *([node.module] if node.module else [])])
                targets = [f"{where}.{a.name}" for a in node.names] + [where]
            found |= {t for t in targets if t in names and t != module}
        graph[module] = found
    return graph


def test_no_module_imports_itself_back_through_others():
    graph = _imports()
    cycles = []

    def visit(node: str, path: list[str], seen: set[str]) -> None:
        for nxt in graph[node]:
            if nxt == path[0]:
                cycles.append(" -> ".join([*path, nxt]))
            elif nxt not in seen and nxt > path[0]:  # each cycle once, from its least module
                seen.add(nxt)
                visit(nxt, [*path, nxt], seen)

    for start in sorted(graph):
        visit(start, [start], {start})
    assert not cycles, cycles


def test_only_the_engine_registry_asks_which_engine_it_is():
    pattern = re.compile(r"engine(_name)? ?[!=]= ?['\"]")
    asking = [
        f"{path.relative_to(REPO)}:{n}"
        for path in (REPO / "neuronserve").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not asking, asking
