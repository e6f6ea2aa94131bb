"""Where the serving container (SageMaker's, and the Kubernetes image built the same way)
finds its models and its engine: the models in /opt/ml/model (SageMaker's model_data)
when it holds any, else those baked into the image (`neuronserve package sagemaker`
copies them to /opt/neuronserve/model, and names the engine it was built for in
/opt/neuronserve/neuronserve.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...registry import ENGINES, default_engine
from ...sources import ModelSourceError

MODEL_DIR = "/opt/ml/model"
BAKED_DIR = "/opt/neuronserve/model"
CONFIG_FILE = "/opt/neuronserve/neuronserve.json"


def model_source() -> Path:
    """SageMaker's model_data if mounted (NEURONSERVE_MODEL_DIR overrides the path), else
    the model baked into the image."""
    mounted = Path(os.environ.get("NEURONSERVE_MODEL_DIR", MODEL_DIR))
    if mounted.is_dir() and any(mounted.iterdir()):
        return mounted
    baked = Path(os.environ.get("NEURONSERVE_BAKED_MODEL", BAKED_DIR))
    if baked.is_dir() and any(baked.iterdir()):
        return baked
    raise ModelSourceError(
        f"no model in {mounted} (SageMaker model_data) nor baked into the image at {baked}"
    )


def engine_name() -> str:
    """The engine the build context was made for, else the first installed
    (`engines.default_engine`): the container's engine unless NEURONSERVE_ENGINE (the
    front's `engine` field) says another."""
    engine = None
    config = Path(os.environ.get("NEURONSERVE_CONFIG", CONFIG_FILE))
    if config.is_file():
        engine = json.loads(config.read_text()).get("engine")
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ModelSourceError(f"{config} names engine {engine!r}: use {' or '.join(ENGINES)}")
    return engine
