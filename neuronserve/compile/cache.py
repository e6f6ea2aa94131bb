"""Compiled artifacts kept for the next start: a model named by Hub id or folder is
compiled once per everything that decides the artifact, and found again after.

The key is a digest of: the model (its Hub id and the commit of the snapshot, or each
file of a local folder with the digest of its contents), the compile and accuracy
sections (task, target, buckets, precision, ...), the name and truncation the artifact
records, the NeuronCores a module spans, and the versions of what compiles and runs it
(neuronserve, Python, torch, transformers, tokenizers, the target's compiler and the
Neuron SDK's, ONNX Runtime's and OpenVINO's packages where installed). Change any and
the next start compiles afresh; the old entry stays until it is removed (`rm -rf` of its
folder is safe while nothing serves it).

The cache folder (NEURONSERVE_CACHE, else $XDG_CACHE_HOME/neuronserve, else
~/.cache/neuronserve) is this user's alone: a compiled module is code the workers run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..artifact import MANIFEST, ArtifactError, read_manifest, sha256_file
from ..names import safe_name
from ..private_folders import NotPrivate, private_folder
from .errors import CompileError
from .hub import ModelFolder, config_task, model_folder

if TYPE_CHECKING:
    from ..artifact import Manifest
    from ..spec import DeploySpec
    from .job import CompileJob

CACHE_ENV = "NEURONSERVE_CACHE"


def cache_root() -> Path:
    """Where compiled artifacts are kept (see the module's doc)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neuronserve"


def _versions(target: str) -> dict[str, Any]:
    import tokenizers
    import torch
    import transformers

    from .. import __version__
    from ..targets import get_target

    return {
        "neuronserve": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        **get_target(target).versions(),
        **{name: installed(name) for name in RUNTIMES},
    }


# what compiles or runs a module beside torch: a new version may build another one
RUNTIMES = (
    "torch-neuronx", "neuronx-cc", "libneuronxla", "torch-neuron", "neuron-cc",
    "onnxruntime", "openvino",
)  # fmt: skip


def installed(name: str) -> str | None:
    """The version of the distribution `name` installed here (None: not installed), read
    without importing it."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _model_identity(model: ModelFolder) -> dict[str, Any]:
    if model.repo_id:
        return {"hub": model.repo_id, "commit": model.revision}
    # what the folder holds, wherever it is: a copy elsewhere is the same model
    return {"files": _files(model.folder.resolve())}


def _files(folder: Path) -> list[list[Any]]:
    """Every file the model folder reads as, with the digest of its contents: through
    symlinked folders too (sentence-transformers' modules are often linked in), each real
    folder once."""
    found, seen = [], set()
    for walked, dirs, names in os.walk(folder, followlinks=True):
        st = os.stat(walked)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        for name in names:
            p = Path(walked) / name
            with contextlib.suppress(OSError):
                found.append([str(p.relative_to(folder)), sha256_file(p)])
    return sorted(found)


def cache_key(job: CompileJob, model: ModelFolder) -> str:
    """The digest of everything that decides the artifact `job` makes of `model`."""
    facts = {
        "model": _model_identity(model),
        "compile": job.compile.model_dump(mode="json", exclude={"model", "revision"}),
        "accuracy": job.accuracy.model_dump(mode="json"),
        "name": job.name,
        "truncation": job.truncation,
        "neuron_cores": job.neuron_cores,
        "versions": _versions(job.compile.target),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _static_shape(job: CompileJob, folder: Path, log: Callable[[str], None]) -> CompileJob:
    """A model whose config.json has a `neuron` section (the Hugging Face toolkit's and
    optimum-neuron's export settings) names the one shape those compile it to: here it is
    the grid's largest, unless the job names its own grid. An export of optimum-neuron
    (its compiled module beside the config) is served in its own shape, unless the job
    recompiles its source model."""
    from ..spec import CompileSection
    from .optimum_export import NEURON_FILE

    if (folder / NEURON_FILE).is_file() and not job.compile.recompile:
        return job

    try:
        neuron = json.loads((folder / "config.json").read_text()).get("neuron")
    except (OSError, ValueError):
        return job
    if not isinstance(neuron, dict):
        return job
    update: dict[str, Any] = {}
    for key, field in (
        ("static_batch_size", "batch_sizes"),
        ("static_sequence_length", "sequence_lengths"),
    ):
        value = neuron.get(key)
        if field in job.compile.model_fields_set or not isinstance(value, int) or value < 1:
            continue
        update[field] = CompileSection.up_to(field, value)
        log(
            f"config.json's neuron section: {key} {value}, compiled as the largest of "
            f"{field.replace('_', ' ')} {','.join(map(str, update[field]))}"
        )
    return replace(job, compile=job.compile.model_copy(update=update)) if update else job


def compiled(
    job: CompileJob,
    log: Callable[[str], None] = print,
    progress: bool = True,
    in_child: bool = False,
) -> Path:
    """The artifact of `job.compile.model` (a Hub id or a folder) from the cache, compiled
    into it first when it is not there (`in_child`: in a process of its own). The task is
    the model config's when the job gives none; the name the Hub name's last part (or the
    folder's) when it gives none."""
    from .driver import compile_job
    from .optimum_export import read_export, refuse_unless_allowed

    if job.compile.model is None:
        raise CompileError("no model: pass --model (a Hugging Face Hub id or a folder)")
    model = model_folder(job.compile.model, job.compile.revision, job.compile.allow_pickle_weights)
    log(f"model {job.compile.model}: {model.said}")
    export = read_export(model.folder)
    if export is not None and not job.compile.recompile:
        refuse_unless_allowed(job, export)  # before anything is asked of the target
    if "task" not in job.compile.model_fields_set:
        job = replace(
            job, compile=job.compile.model_copy(update={"task": config_task(model.folder)})
        )
    job = _static_shape(job, model.folder, log)
    name = job.name or _default_name(model)
    job = replace(job, name=name)
    key = cache_key(job, model)
    root = _artifacts()
    out = root / key / name
    with _locked(root / f"{key}.lock"):
        found = _usable(out)
        if found:
            log(f"{job.compile.model}: compiled before, from the cache ({out})")
            return out
        doing = (
            f"compiling for {job.compile.task} on {job.compile.target}"
            if export is None or job.compile.recompile
            else f"{export.said}: served as it is, not compiled (--recompile compiles its "
            "source model)"
        )
        log(f"{job.compile.model}: {doing} (kept in {root} for the next start)")
        (root / key).mkdir(mode=0o700, exist_ok=True)
        job = replace(
            job, compile=job.compile.model_copy(update={"model": str(model.folder)}), out=out
        )
        if not in_child:
            return compile_job(job, progress, log=None)  # said above
        # a server compiling at start keeps torch and its thread pools out of its own
        # process: loaded there, they crashed its exit on SIGTERM (SIGSEGV)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
            return child.submit(compile_job, job, progress, None).result()


def compiled_to(job: CompileJob, progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """`neuronserve compile`: the artifact of `job` in `job.out`, copied from the cache
    where the same inputs were compiled before, else compiled into the cache first (so
    that the next compile of them, or a start naming them, compiles nothing)."""
    from .driver import compile_job, staged

    out = job.out
    if job.compile.model is None or out is None:
        return compile_job(job, progress)  # which says what is missing
    model = model_folder(job.compile.model, job.compile.revision, job.compile.allow_pickle_weights)
    job = replace(job, name=job.name or Path(out).resolve().name)
    key = cache_key(job, model)
    root = _artifacts()
    cached = root / key / str(job.name)
    with _locked(root / f"{key}.lock"):
        if _usable(cached):
            log(f"{job.compile.model}: compiled before with these options; copied from {cached}")
        else:
            (root / key).mkdir(mode=0o700, exist_ok=True)
            compile_job(replace(job, out=cached), progress)
        return staged(Path(out), lambda into: _copy(cached, into))


def _copy(artifact: Path, into: Path) -> Manifest:
    shutil.copytree(artifact, into, dirs_exist_ok=True)
    (into / MANIFEST).unlink()  # written again, whole, once the copy is
    return read_manifest(artifact, verify=False)


def _artifacts() -> Path:
    """The cache's folder of artifacts, this user's alone (CompileError otherwise)."""
    try:
        return private_folder(cache_root() / "artifacts", own=2)
    except NotPrivate as e:
        raise CompileError(
            f"artifact cache {e}: the workers run the modules kept there; make it this "
            f"user's alone (chmod 700) or set {CACHE_ENV} to another folder"
        ) from None


def _default_name(model: ModelFolder) -> str:
    try:
        return safe_name(model.name, "the model's name")
    except ValueError as e:
        raise CompileError(f"{e}; give one with --name") from None


def _usable(out: Path) -> bool:
    """Whether `out` is a whole artifact whose files are as its manifest lists them."""
    if not (out / MANIFEST).is_file():
        return False
    try:
        read_manifest(out)
    except ArtifactError:
        return False
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One compile of a key at a time: a second start waits for the first's artifact."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def resolved(
    spec: DeploySpec,
    log: Callable[[str], None] = print,
    progress: bool = True,
    target: str | None = None,
) -> DeploySpec:
    """`spec` with every model it names by Hub id or folder (spec.model_sources) replaced
    by its compiled artifact, from the cache or compiled into it now (in a process of its
    own: a server starting never holds the compiler), for the target the compile section
    names, else `target` (a package's), else this host's; `spec` itself when it names
    none."""
    from ..spec import ModelEntry, ModelSource
    from ..targets import host_target
    from .job import CompileJob

    sources = spec.model_sources()
    if not sources:
        return spec
    base = CompileJob.of(spec)
    if "target" not in spec.compile.model_fields_set:
        chosen = target or host_target()
        base = replace(base, compile=base.compile.model_copy(update={"target": chosen}))
    entries: list[ModelEntry] = []
    for m in spec.models or sources:
        if not isinstance(m, ModelSource):
            entries.append(m)
            continue
        update: dict[str, Any] = {"model": m.model, "revision": m.revision}
        if m.task is not None:
            update["task"] = m.task
        job = replace(
            base,
            compile=base.compile.model_copy(update=update),
            name=m.name,
            truncation=m.truncation if m.truncation is not None else spec.truncation,
        )
        artifact = compiled(job, log, progress, in_child=True)
        entries.append(ModelEntry(artifact=artifact, name=artifact.name, truncation=m.truncation))
    # what it compiled is served: the compile section's model no longer names one
    compiled_from = spec.with_section("compile", model=None)
    return compiled_from.with_models(entries)
