"""What a sentence-transformers model folder adds to its Hugging Face model: the modules
after the transformer (`modules.json`: pooling, Dense, Normalize, SPLADE pooling) and
the prompts (`config_sentence_transformers.json`).

Every module is honoured or refused by name, never skipped: an embedder whose Dense
layer were left out would answer vectors of the wrong size, or of the right size and
quietly wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# a module's type in modules.json ends with one of these (sentence-transformers moved its
# modules between packages over the versions: models.Pooling, sentence_transformer.modules...)
_TRANSFORMER = ("Transformer", "MLMTransformer")
_POOLING, _DENSE, _NORMALIZE, _SPLADE = "Pooling", "Dense", "Normalize", "SpladePooling"
# a Dense module's activation, by the class name its config records
ACTIVATIONS = {"Identity": "identity", "Tanh": "tanh", "ReLU": "relu", "GELU": "gelu"}
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
SPLADE_STRATEGIES = ("max", "sum")


@dataclass(frozen=True)
class DenseLayer:
    """A Dense module: y = activation(W x + b), after pooling."""

    folder: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key's value of ACTIVATIONS


@dataclass(frozen=True)
class Splade:
    """SPLADE pooling over a masked-LM's logits: activation, then max (or sum) over tokens."""

    strategy: str = "max"
    activation: str = "relu"


@dataclass(frozen=True)
class Modules:
    """The modules of a sentence-transformers folder that shape its output."""

    pooling: str | None = None  # cls | mean | splade; None: no sentence-transformers layout
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False
    splade: Splade | None = None


@dataclass(frozen=True)
class Prompts:
    """config_sentence_transformers.json's prompts (name -> text put before each input)
    and the one used when a request names none."""

    prompts: dict[str, str] = field(default_factory=dict)
    default: str | None = None


def _kind(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def read_modules(model_dir: Path) -> Modules:
    """The modules of `model_dir/modules.json` (no file: an empty Modules); a module that
    is neither honoured nor harmless is a ValueError naming it."""
    path = Path(model_dir) / "modules.json"
    if not path.is_file():
        return Modules()
    pooling, normalize, splade = None, False, None
    dense: list[DenseLayer] = []
    for m in json.loads(path.read_text()):
        kind, folder = _kind(m.get("type", "")), str(m.get("path", ""))
        if Path(folder).is_absolute() or ".." in Path(folder).parts:
            raise ValueError(
                f"{model_dir}: modules.json names module folder {folder!r}, outside the "
                "model folder: a module's path is relative to it"
            )
        config = _config(Path(model_dir) / folder)
        if kind in _TRANSFORMER:
            continue
        if kind == _POOLING:
            pooling = _pooling_mode(config, model_dir)
        elif kind == _DENSE:
            dense.append(_dense(config, folder, model_dir))
        elif kind == _NORMALIZE:
            normalize = True
        elif kind == _SPLADE:
            splade = _splade(config, model_dir)
            pooling = "splade"
        else:
            where = folder or "no folder"
            raise ValueError(
                f"{model_dir}: sentence-transformers module {m.get('type')} ({where}) is not "
                "supported: neuronserve compiles Transformer, Pooling (cls or mean), Dense, "
                "Normalize and SpladePooling modules"
            )
    return Modules(pooling, tuple(dense), normalize, splade)


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _pooling_mode(config: dict[str, Any], model_dir: Path) -> str:
    if config.get("include_prompt") is False:
        raise ValueError(
            f"{model_dir}: its Pooling module leaves the prompt's tokens out "
            "(include_prompt: false), which neuronserve does not compile"
        )
    # sentence-transformers 6 names the mode; earlier versions set one flag of several
    mode = config.get("pooling_mode")
    if mode in ("cls", "mean") or config.get("pooling_mode_cls_token"):
        return mode or "cls"
    if config.get("pooling_mode_mean_tokens"):
        return "mean"
    modes = [f"{k}={v}" for k, v in config.items() if k.startswith("pooling_mode") and v]
    raise ValueError(
        f"{model_dir}: sentence-transformers pooling {modes} is not supported; "
        "set `pooling: mean` or `pooling: cls` in the spec to override"
    )


def _dense(config: dict[str, Any], folder: str, model_dir: Path) -> DenseLayer:
    activation = _kind(str(config.get("activation_function") or "Identity"))
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{model_dir}: the Dense module in {folder} uses activation {activation}; "
            f"neuronserve compiles {', '.join(ACTIVATIONS)}"
        )
    if config.get("use_residual"):
        raise ValueError(f"{model_dir}: the Dense module in {folder} is residual: not supported")
    return DenseLayer(
        folder,
        int(config["in_features"]),
        int(config["out_features"]),
        bool(config.get("bias", True)),
        ACTIVATIONS[activation],
    )


def _splade(config: dict[str, Any], model_dir: Path) -> Splade:
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise ValueError(
            f"{model_dir}: SpladePooling with pooling_strategy {strategy!r} and "
            f"activation_function {activation!r} is not supported (strategies "
            f"{SPLADE_STRATEGIES}, activations {SPLADE_ACTIVATIONS})"
        )
    return Splade(strategy, activation)


def read_prompts(model_dir: Path) -> Prompts:
    """The prompts of `model_dir/config_sentence_transformers.json` (none without it)."""
    path = Path(model_dir) / "config_sentence_transformers.json"
    if not path.is_file():
        return Prompts()
    config = json.loads(path.read_text())
    prompts = {str(k): str(v) for k, v in (config.get("prompts") or {}).items()}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(
            f"{path}: default_prompt_name {default!r} is not among its prompts {sorted(prompts)}"
        )
    return Prompts(prompts, default)
