"""The shape the code keeps (ruff and mypy check the rest): no function over 60 lines
unless a `# long:` comment in it says why, and no import cycle between the packages."""

from __future__ import annotations

import ast
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
