"""Folders as `optimum-cli export neuron` writes them, made with the stand-in SDK's
torch_neuronx.trace (call inside `standin_process`): model.neuron, a config.json with the
`neuron` section optimum-neuron's store_compilation_config writes, the tokenizer and, for
a sentence-transformers export, its modules. What the module computes follows
optimum-neuron's wrappers: a transformers encoder answers (last_hidden_state,
pooler_output), a sentence-transformers one (token_embeddings, sentence_embedding), a
classifier (logits,)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

ST_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")


class _Encoder(torch.nn.Module):
    def __init__(self, model, token_types: bool):
        super().__init__()
        self.model, self.token_types = model, token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types:
            kwargs["token_type_ids"] = token_type_ids
        return self.model(**kwargs, return_dict=False)


class _SentenceTransformer(torch.nn.Module):
    """Transformer, mean Pooling and Normalize, as sentence-transformers runs them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return hidden, torch.nn.functional.normalize(pooled, dim=-1)


def optimum_export(
    out: Path,
    model_dir: Path,
    kind: str = "transformers",
    batch: int = 2,
    seq: int = 32,
    dynamic: bool = False,
    compiler: str = "neuronx-cc",
    compiler_version: str = "2.18.0.0",
    source: str | None = None,
) -> Path:
    """An export of `model_dir` (`kind`: transformers | sentence-transformers |
    classifier) at `batch` x `seq`, compiled at fp32 (`--auto-cast none`)."""
    import torch_neuronx
    from transformers import AutoModel, AutoModelForSequenceClassification

    out.mkdir(parents=True, exist_ok=True)
    if kind == "classifier":
        module = _Encoder(AutoModelForSequenceClassification.from_pretrained(model_dir), True)
        task, names = "text-classification", 3
    elif kind == "sentence-transformers":
        module, task, names = _SentenceTransformer(AutoModel.from_pretrained(model_dir)), None, 2
    else:
        module, task, names = _Encoder(AutoModel.from_pretrained(model_dir), True), None, 3
    # a mask with padding, as optimum-neuron's dummy inputs have (random_mask_tensor): an
    # all-ones mask is dropped by transformers while tracing, and so from the graph
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2 :] = 0
    example = (
        torch.ones(batch, seq, dtype=torch.long),
        mask,
        torch.zeros(batch, seq, dtype=torch.long),
    )[:names]
    traced = torch_neuronx.trace(module.eval(), example, compiler_args=["--auto-cast", "none"])
    torch.jit.save(traced, str(out / "model.neuron"))
    _export_files(out, model_dir, kind, task, batch, seq, dynamic, compiler, compiler_version)
    if source:
        config = json.loads((out / "config.json").read_text())
        config["_name_or_path"] = source
        (out / "config.json").write_text(json.dumps(config))
    return out


class WritesAtLoad(torch.nn.Module):
    """A scripted module whose `__setstate__`, which torch.jit.load runs, writes 4 bytes
    to `path` (torch.from_file with shared=True creates the file): what any TorchScript
    archive may do when loaded, with no weights file at all."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.written = torch.zeros(4, dtype=torch.uint8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return input_ids

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.path, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.path, self.training = state[0], state[1]
        # kept in an attribute: TorchScript drops an unused tensor, and its write with it
        self.written = torch.from_file(self.path, shared=True, size=4, dtype=torch.uint8)
        self.written.fill_(65)


def export_writing_at_load(out: Path, model_dir: Path, written: Path) -> Path:
    """A folder shaped as an optimum-neuron export of `model_dir` (for neuronx) whose
    model.neuron writes `written` when it is loaded."""
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(WritesAtLoad(str(written))), str(out / "model.neuron"))
    _export_files(out, model_dir, "transformers", None, 1, 32, False, "neuronx-cc", "2.18.0.0")
    return out


def _export_files(
    out: Path,
    model_dir: Path,
    kind: str,
    task: str | None,
    batch: int,
    seq: int,
    dynamic: bool,
    compiler: str,
    compiler_version: str,
) -> None:
    """config.json with its neuron section, the tokenizer and, for a sentence-transformers
    export, its modules: what an export holds beside model.neuron."""
    config = json.loads((model_dir / "config.json").read_text())
    config["neuron"] = {
        "compiler_type": compiler,
        "compiler_version": compiler_version,
        "inline_weights_to_neff": True,
        "static_batch_size": batch,
        "static_sequence_length": seq,
        "dynamic_batch_size": dynamic,
        "tensor_parallel_size": 1,
        "optlevel": "2",
        "auto_cast": None,
        "auto_cast_type": None,
        "int_dtype": "int64",
        "float_dtype": "fp32",
        "model_type": "transformer" if kind == "sentence-transformers" else config["model_type"],
        "output_attentions": False,
        "output_hidden_states": False,
        "task": task or "feature-extraction",
    }
    (out / "config.json").write_text(json.dumps(config))
    for f in model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy2(f, out / f.name)
    if kind == "sentence-transformers":
        _sentence_transformers_files(out)


def _sentence_transformers_files(out: Path) -> None:
    kinds = ("Transformer", ""), ("Pooling", "1_Pooling"), ("Normalize", "2_Normalize")
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (kind, path) in enumerate(kinds)
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
