"""The shape the code keeps (ruff and mypy check the rest): no function over 60 lines
unless a `# long:` comment in it says why, no import cycle between modules (counting
every import: at the top, inside functions and for type checking), and nothing but the
packagers of Triton's repository and TorchServe's store deciding by a server's name."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from helpers import REPO

LIMIT = 60


@functools.cache
def _nodes(path: Path) -> list[ast.AST]:
    """Every node of a module's syntax tree (the tests here read the same files)."""
    return list(ast.walk(ast.parse(path.read_text())))


def test_functions_are_short_or_say_why():
    long = []
    for root in ("neuronserve", "handlers", "triton_backend", "scripts"):
        for path in (REPO / root).rglob("*.py"):
            lines = path.read_text().splitlines()
            for node in _nodes(path):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                body = lines[node.lineno - 1 : node.end_lineno]
                if len(body) > LIMIT and not any("# long:" in line for line in body):
                    long.append(
                        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({len(body)} lines)"
                    )
    assert not long, long


@functools.cache
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
        for node in _nodes(path):
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


# what names an engine in code: its registry names, and its classes' prefixes
ENGINE_WORDS = ("torchserve", "triton", "tritonserver", "kserve")
ENGINE_CLASSES = ("TorchServe", "Triton")


def _names_engine(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in ENGINE_WORDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_engine(e) for e in node.elts)
    return False


def _engine_class(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id.startswith(ENGINE_CLASSES))
        or (isinstance(n, ast.Attribute) and n.attr.startswith(ENGINE_CLASSES))
        for n in ast.walk(node)
    )


def engine_branches(source: str | Path) -> list[str]:
    """Every place `source` decides by which engine it is: a comparison or membership
    test against an engine's name (`engine == "triton"`, `protocol != "kserve"`,
    `engine not in ("torchserve", ...)`), a dict keyed by engine names, a match case on
    one, an isinstance of an engine's class."""
    found = []
    nodes = _nodes(source) if isinstance(source, Path) else ast.walk(ast.parse(source))
    for node in nodes:
        if isinstance(node, ast.Compare) and (
            _names_engine(node.left) or any(_names_engine(c) for c in node.comparators)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and any(_names_engine(k) for k in node.keys):
            found.append(f"{node.lineno}: a dict keyed by engine names")
        elif isinstance(node, ast.match_case) and _names_engine(
            getattr(node.pattern, "value", None)
        ):
            found.append(f"{node.pattern.lineno}: case {ast.unparse(node.pattern)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and _engine_class(node.args[1])
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_branch_finder_finds_each_form():
    forms = [
        'if engine == "triton": pass',
        "if protocol != 'kserve': pass",
        'ok = engine not in ("torchserve", "triton")',
        'x = {"torchserve": 1, "triton": 2}[name]',
        'match engine:\n    case "triton":\n        pass',
        "if isinstance(client, TritonClient): pass",
        "if isinstance(client, (clients.TorchServeClient, str)): pass",
    ]
    assert [len(engine_branches(f)) for f in forms] == [1] * len(forms)
    assert engine_branches('if task == "rerank": pass\nname = "triton"') == []


def test_only_the_packagers_decide_by_a_servers_name():
    """neuronserve serves on its own workers only: outside packaging/ (what Triton and
    TorchServe load) no code decides by a server's name or class, and there is no
    engine interface, registry or managed server left to ask."""
    asking = [
        f"{path.relative_to(REPO)}:{where}"
        for path in (REPO / "neuronserve").rglob("*.py")
        if path.relative_to(REPO / "neuronserve").parts[0] != "packaging"
        for where in engine_branches(path)
    ]
    # the one exception: the spec refuses what asks for one of their servers, naming
    # what to run instead (served_elsewhere)
    refusal = [a for a in asking if a.startswith("neuronserve/spec.py:")]
    assert len(refusal) <= 1 and not set(asking) - set(refusal), asking
    assert not (REPO / "neuronserve" / "engines").exists()
    assert not (REPO / "neuronserve" / "registry.py").exists()


def _node(module: str) -> str:
    """The part of the house a module belongs to: its top-level module or folder."""
    return module.split(".")[1] if module.count(".") else module


def test_the_house_imports_only_downward():
    """Each top-level module and folder of neuronserve taken as one node, the imports
    between them (every import: at the top, inside functions and for type checking) form
    no cycle: each node can be read, changed and tested with what lies below it; the
    workers and the packagers import nothing above them (serve, bench, platforms, cli)."""
    edges: dict[str, dict[str, str]] = {}
    for module, imported in _imports().items():
        for target in imported:
            a, b = _node(module), _node(target)
            if a != b and module.count(".") and target.count("."):
                edges.setdefault(a, {}).setdefault(b, f"{module} -> {target}")
    nodes = sorted({n for a, bs in edges.items() for n in (a, *bs)})
    reach = {n: set(edges.get(n, {})) for n in nodes}
    changed = True
    while changed:  # transitive closure: small graph
        changed = False
        for n in nodes:
            more = set().union(*(reach[m] for m in reach[n])) - reach[n]
            if more:
                reach[n] |= more
                changed = True
    both = sorted(
        f"{a} -> {b} ({edges[a][b]})" for a in nodes for b in edges.get(a, {}) if a in reach[b]
    )
    assert not both, both


def test_no_arrow_runs_back_up():
    """No library module imports the CLI."""
    wrong = []
    for module, imported in _imports().items():
        for target in imported:
            if target.startswith("neuronserve.cli") and not module.startswith("neuronserve.cli"):
                wrong.append(f"{module} -> {target}")
    assert not wrong, sorted(wrong)


def test_the_compile_reads_its_sections_not_the_whole_spec():
    """The compile package is handed a CompileJob (its compile and accuracy sections and
    the few facts it records); the whole spec appears only where jobs are made of it: a
    compile's (job.py: CompileJob.of) and the models a deployment names by Hub id or
    folder, one job each (cache.resolved)."""
    reading = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in (REPO / "neuronserve" / "compile").rglob("*.py")
        for node in _nodes(path)
        if isinstance(node, ast.Name) and node.id == "DeploySpec"
    ]
    allowed = {"neuronserve/compile/job.py", "neuronserve/compile/cache.py"}
    assert {r.split(":")[0] for r in reading} <= allowed, reading


def test_the_adapters_import_only_the_worker_contract():
    """What Triton and TorchServe load (the TorchServe handler, Triton's model.py)
    reaches neuronserve through neuronserve.worker alone: the contract it
    names is the one place an adapter depends on."""
    from neuronserve import worker

    imported = {}
    for path in [*(REPO / "handlers").glob("*.py"), *(REPO / "triton_backend").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neuronserve"):
                imported.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("neuronserve") for a in node.names), path
    assert set(imported) == {"neuronserve.worker"}, sorted(imported)
    for name in imported["neuronserve.worker"]:
        assert getattr(worker, name) is not None, name  # each one resolves
