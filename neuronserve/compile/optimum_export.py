"""A model optimum-neuron has already compiled (`optimum-cli export neuron`, or a Hub
repository such as `optimum/bge-base-en-v1.5-neuronx` and the `aws-neuron/` exports),
made an artifact as it is: no compile.

Such a folder holds `model.neuron`, a TorchScript module of the Neuron SDK that
`torch.jit.load` loads onto a NeuronCore (optimum-neuron's
`NeuronTracedModel.load_model`), and a config.json whose `neuron` section says how it
was compiled (optimum-neuron's `store_compilation_config`): `compiler_type`
(neuronx-cc: Inf2/Trn1; neuron-cc: Inf1), `compiler_version`, `static_batch_size`,
`static_sequence_length`, `dynamic_batch_size` (the module takes any multiple of the
static batch), `task`, `model_type` ("transformer": a sentence-transformers model) and
`auto_cast` / `auto_cast_type`. Its inputs are the tokenizer's, in the order of
optimum-neuron's model configs (`optimum/exporters/neuron/model_configs.py`); it answers
a tuple whose first tensor is the one served here: `last_hidden_state` (a transformers
export, pooled on the host), `token_embeddings` (a sentence-transformers export, pooled
on the host as its Pooling module says, so `normalize: false` is answered as for a
compiled artifact) or `logits`.

optimum-neuron refuses a module compiled by a newer compiler than the one installed
(`check_compiler_compatibility`): so does this, and one of another major version. A
module for another target or compiler can be compiled again from its source model
(`--recompile`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..artifact import ExportSettings, InputSpec, Manifest, TokenizerSettings
from ..buckets import BucketGrid
from ..names import is_hub_id
from ..spec import TRUNCATION_AT_COMPILE
from ..tasks import Task, WrappedModel, get_task
from ..tasks.sentence_transformers import read_modules
from .errors import CompileError
from .job import CompileJob
from .saved import save_tokenizer, versions

if TYPE_CHECKING:
    from packaging.version import Version

NEURON_FILE = "model.neuron"
# optimum-neuron's compiler_type -> the target that runs what it compiled
TARGETS = {"neuronx-cc": "neuronx", "neuron-cc": "neuron"}
HOSTS = {"neuronx": "Inf2/Trn1", "neuron": "Inf1"}
COMPILERS = {"neuronx": "neuronxcc", "neuron": "neuroncc"}
# model types whose optimum-neuron config takes no token_type_ids
NO_TOKEN_TYPES = {
    "camembert", "distilbert", "esm", "modernbert", "mpnet", "phi", "roberta", "xlm-roberta",
}  # fmt: skip
# optimum-neuron's task -> the task served here (a sequence classifier: its labels decide)
TASKS = {
    "feature-extraction": "feature-extraction",
    "sentence-similarity": "feature-extraction",
    "text-classification": "text-classification",
}
# a dynamic-batch module runs any multiple of its batch: these multiples are the grid's
DYNAMIC_MULTIPLES = (1, 2, 4, 8)


@dataclass(frozen=True)
class OptimumExport:
    """What an optimum-neuron export's config.json says of its module."""

    folder: Path
    target: str
    compiler: str
    compiler_version: str
    batch: int
    seq: int
    dynamic_batch: bool
    task: str
    sentence_transformers: bool
    config: dict[str, Any]

    @property
    def source(self) -> str | None:
        """The model it was exported from (its Hub id), where the config names one."""
        name = str(self.config.get("_name_or_path") or "")
        return name if is_hub_id(name) else None

    @property
    def said(self) -> str:
        return (
            f"an optimum-neuron export compiled by {self.compiler} {self.compiler_version} "
            f"for {HOSTS[self.target]} (target {self.target}), batch {self.batch}"
            f"{' (any multiple)' if self.dynamic_batch else ''}, sequence length {self.seq}"
        )

    @property
    def grid(self) -> BucketGrid:
        multiples = DYNAMIC_MULTIPLES if self.dynamic_batch else (1,)
        return BucketGrid(tuple(self.batch * k for k in multiples), (self.seq,))

    @property
    def input_names(self) -> list[str]:
        named = self.config["neuron"].get("input_names")
        if isinstance(named, list) and named:
            return [str(n) for n in named]
        model_type = str(self.config.get("model_type", ""))
        types = self.config.get("type_vocab_size", 2)
        if self.sentence_transformers or model_type in NO_TOKEN_TYPES or types == 0:
            return ["input_ids", "attention_mask"]
        return ["input_ids", "attention_mask", "token_type_ids"]


def read_export(folder: Path) -> OptimumExport | None:
    """The export in `folder`, or None when it is not one (no model.neuron, or a config
    without a compiled `neuron` section); CompileError when its section is unusable."""
    config_file, module = Path(folder) / "config.json", Path(folder) / NEURON_FILE
    if not module.is_file() or not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    neuron = config.get("neuron")
    if not isinstance(neuron, dict) or "compiler_type" not in neuron:
        return None
    compiler = str(neuron["compiler_type"])
    if compiler not in TARGETS:
        raise CompileError(
            f"{folder}: compiler_type {compiler!r} is neither neuronx-cc nor neuron-cc"
        )
    batch, seq = neuron.get("static_batch_size"), neuron.get("static_sequence_length")
    if not isinstance(batch, int) or not isinstance(seq, int) or batch < 1 or seq < 1:
        raise CompileError(
            f"{folder}: the export's neuron section names no static_batch_size and "
            "static_sequence_length: it is not a text encoder's export"
        )
    task = str(neuron.get("task") or "feature-extraction")
    return OptimumExport(
        folder=Path(folder),
        target=TARGETS[compiler],
        compiler=compiler,
        compiler_version=str(neuron.get("compiler_version") or "unknown"),
        batch=batch,
        seq=seq,
        dynamic_batch=bool(neuron.get("dynamic_batch_size")),
        task=task,
        sentence_transformers=neuron.get("model_type") == "transformer",
        config=config,
    )


def _installed_compiler(target: str) -> str | None:
    try:
        module = __import__(COMPILERS[target])
    except ImportError:
        return None
    return str(getattr(module, "__version__", "")) or None


def check_runs_here(export: OptimumExport, target: str) -> None:
    """CompileError, with what to do, where the export's module cannot run on `target`
    or was compiled by a newer compiler than this host's."""
    recompile = (
        f"pass --recompile to compile its source model {export.source} for {target} instead"
        if export.source
        else "compile its source model for this target instead (the export names none)"
    )
    if export.target != target:
        raise CompileError(
            f"{export.folder} is {export.said}; this deployment is for target {target}: serve "
            f"it on an {HOSTS[export.target]} host, or {recompile}"
        )
    installed = _installed_compiler(target)
    if installed is None:
        return
    made, here = _version(export.compiler_version), _version(installed)
    if made is None or here is None:
        return
    if made.major != here.major or made > here:
        which = "another major version than" if made.major != here.major else "newer than"
        raise CompileError(
            f"{export.folder} was compiled by {export.compiler} {export.compiler_version}, "
            f"{which} this host's {installed}: install the Neuron SDK it was compiled "
            f"with, or {recompile}"
        )


def _version(text: str) -> Version | None:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return None


class _Headless(torch.nn.Module):
    """The export's config where a task's wrap expects the model: an export brings its
    compiled head, so only what the manifest records of the task is asked of it."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config


def _task(job: CompileJob, export: OptimumExport) -> str:
    from .hub import config_task

    served = TASKS.get(export.task)
    if served is None:
        raise CompileError(
            f"{export.folder}: an optimum-neuron export for {export.task} is not served as it "
            "is (feature-extraction, sentence-similarity and text-classification are): "
            "compile its source model with --recompile"
        )
    if served == "text-classification":
        served = config_task(export.folder)  # one label: a cross-encoder
    asked = job.compile.task if "task" in job.compile.model_fields_set else served
    if asked != served and {asked, served} != {"rerank", "text-classification"}:
        raise CompileError(
            f"{export.folder} was exported for {export.task}, not {asked}: serve it as "
            f"{served}, or compile its source model for {asked} with --recompile"
        )
    return asked


def import_export(job: CompileJob, export: OptimumExport, out: Path) -> Manifest:
    """Write the artifact of `export` into `out` (its module as it is, the tokenizer,
    config.json) and return its manifest."""
    from transformers import AutoConfig

    _refuse_what_does_not_run_as_it_is(job, export)
    task = get_task(_task(job, export))
    config = AutoConfig.from_pretrained(export.folder)
    wrapped = task.wrap(
        _Headless(config),
        export.folder,
        {
            "pooling": job.compile.pooling,
            "normalize": job.compile.normalize,
            "input_names": export.input_names,
            "relevance_label": job.compile.relevance_label,
        },
    )
    facts = save_tokenizer(export.folder, out)
    shutil.copy2(export.folder / NEURON_FILE, out / NEURON_FILE)
    shutil.copy2(export.folder / "config.json", out / "config.json")
    return _manifest(job, export, out, task, config, wrapped, facts)


def refuse_unless_allowed(job: CompileJob, export: OptimumExport) -> None:
    """CompileError naming the risk, unless the job allows a module compiled elsewhere:
    torch.jit.load runs what a TorchScript archive's own methods say (a scripted
    `__setstate__` runs at load, with no weights file needed), as a pickle does."""
    if job.compile.allow_exported_module:
        return
    source = (
        f" (--recompile compiles its source model {export.source} here instead)"
        if export.source
        else ""
    )
    raise CompileError(
        f"{export.folder} is {export.said}: its {NEURON_FILE} is a TorchScript archive "
        "compiled elsewhere, and loading one runs code of its own (its methods run at load, "
        "as a pickle's do), so neuronserve does not load it unasked. Pass "
        "--allow-exported-module (NEURONSERVE_ALLOW_EXPORTED_MODULE=true in a container) if "
        f"you trust where it came from, or compile its source model with --recompile{source}"
    )


def _refuse_what_does_not_run_as_it_is(job: CompileJob, export: OptimumExport) -> None:
    refuse_unless_allowed(job, export)  # compile_job asked first; import_export's own word
    check_runs_here(export, job.compile.target)
    if export.config["neuron"].get("inline_weights_to_neff") is False:
        raise CompileError(
            f"{export.folder}: its weights are not in {NEURON_FILE} (exported with "
            "inline_weights_to_neff false: optimum-neuron puts its source model's weights "
            "in at load): compile its source model with --recompile"
        )
    modules = read_modules(export.folder)
    if modules.dense or modules.splade:
        raise CompileError(
            f"{export.folder}: a sentence-transformers export with Dense or SPLADE modules "
            "is not served as it is: compile its source model with --recompile"
        )


def _manifest(  # noqa: PLR0913 - the export, and what was made of it
    job: CompileJob,
    export: OptimumExport,
    out: Path,
    task: Task,
    config: Any,
    wrapped: WrappedModel,
    facts: dict[str, Any],
) -> Manifest:
    pooling = wrapped.manifest_fields.get("pooling")
    grid = export.grid
    neuron = export.config["neuron"]
    precision = str(neuron.get("auto_cast_type") or "bf16") if neuron.get("auto_cast") else "fp32"
    return Manifest(
        name=job.name or Path(job.out or out).resolve().name,
        task=task.name,
        architecture=(config.architectures or ["?"])[0],
        model_type=config.model_type,
        target=export.target,
        precision=precision,
        batch_sizes=list(grid.batch_sizes),
        sequence_lengths=list(grid.sequence_lengths),
        inputs=[
            InputSpec(name=n, pad_value=facts["pad_token_id"] if n == "input_ids" else 0)
            for n in export.input_names
        ],
        output_name=wrapped.output_name,
        output_dim=_output_dim(task.name, config, wrapped.manifest_fields),
        modules={b.key: NEURON_FILE for b in grid.buckets},
        tokenizer=TokenizerSettings(
            max_length=export.seq,
            truncation=TRUNCATION_AT_COMPILE if job.truncation is None else job.truncation,
            **facts,
        ),
        versions=versions(),
        compiler={
            "compiler": f"{export.compiler} {export.compiler_version}",
            "precision": precision,
            "inline_weights_to_neff": True,
            "cores_per_module": 1,
            # its NEFF holds the weights as the device does: what a core's memory must hold
            "weight_bytes": (out / NEURON_FILE).stat().st_size,
        },
        exported=ExportSettings(
            by="optimum-neuron",
            pooling=pooling if task.name == "feature-extraction" else None,
            allowed=True,
        ),
        tolerance=job.compile.tolerance,
        validation_status="imported",
        validation_note=(
            f"{export.said}: not checked by neuronserve (no eager reference here); served "
            "as it is because --allow-exported-module said so (compile --recompile builds "
            "and checks its own)"
        ),
        **wrapped.manifest_fields,
    )


def _output_dim(task: str, config: Any, fields: dict[str, Any]) -> int:
    if task == "feature-extraction":
        return int(config.hidden_size)
    return len(fields.get("labels") or []) or int(getattr(config, "num_labels", 1))


def recompile_source(export: OptimumExport) -> str:
    """The model to compile in the export's place (`--recompile`)."""
    if export.source is None:
        raise CompileError(
            f"{export.folder} does not name its source model (config.json's _name_or_path): "
            "compile that model by its Hub id or folder instead"
        )
    return export.source
