"""A plain wheel install (not editable) carries the handler and the Triton model.py as
package data, and
`neuronserve` is the only import name it installs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import REPO


def test_wheel_ships_handler_and_only_neuronserve(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    [wheel] = (tmp_path / "dist").glob("neuronserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"neuronserve"}, top
    assert "neuronserve/_handlers/neuronserve_handler.py" in names
    assert "neuronserve/_triton_backend/model.py" in names
    # every module of the source tree, and the data files beside them, are in it
    shipped = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "neuronserve").rglob("*")
        if p.suffix in (".py", ".xml") and "__pycache__" not in p.parts
    }
    assert not shipped - set(names), sorted(shipped - set(names))

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import neuronserve, neuronserve.resources as r; "
        "print(neuronserve.__file__); "
        "print(r.package_file('neuronserve._handlers', 'neuronserve_handler.py')); "
        "print(r.package_file('neuronserve._triton_backend', 'model.py'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert all(p.startswith(str(target)) for p in out), out
    assert Path(out[1]).read_text() == (REPO / "handlers" / "neuronserve_handler.py").read_text()
    assert Path(out[2]).read_text() == (REPO / "triton_backend" / "model.py").read_text()
