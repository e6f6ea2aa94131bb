"""Where the serving container (SageMaker's, and the Kubernetes image built the same way)
finds its models: those in /opt/ml/model (SageMaker's model_data) when it holds any, else
those baked into the image (`neuronserve package sagemaker` copies them to
/opt/neuronserve/model)."""

from __future__ import annotations

import os
from pathlib import Path

from ...sources import ModelSourceError

MODEL_DIR = "/opt/ml/model"
BAKED_DIR = "/opt/neuronserve/model"


def model_source(baked: bool = True) -> Path:
    """SageMaker's model_data if mounted (NEURONSERVE_MODEL_DIR overrides the path), else
    the model baked into the image (not for a multi-model endpoint, `baked=False`: it
    serves what SageMaker loads, and lists nothing else)."""
    mounted = Path(os.environ.get("NEURONSERVE_MODEL_DIR", MODEL_DIR))
    if mounted.is_dir() and any(mounted.iterdir()):
        return mounted
    in_image = Path(os.environ.get("NEURONSERVE_BAKED_MODEL", BAKED_DIR))
    if baked and in_image.is_dir() and any(in_image.iterdir()):
        return in_image
    raise ModelSourceError(
        f"no model in {mounted} (SageMaker model_data) nor baked into the image at {in_image}"
    )
