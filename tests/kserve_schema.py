"""Validate KServe objects against the KServe package's own API models.

The `kserve` Python package holds the OpenAPI models of KServe's CRDs (InferenceService,
ServingRuntime, ...; generated from the same Go types as the CRDs), and the Kubernetes
Python client those of the core types they embed (V1Container, V1EnvVar, ...). Each model
lists its fields (`attribute_map`: Python name -> JSON name) and their types
(`openapi_types`), and its constructor refuses a missing required field. The kserve
package itself cannot be installed next to neuronserve (it pins starlette, protobuf and
FastAPI versions of its own), so scripts/install.sh downloads its wheel without
dependencies and only the model modules are loaded from it, never its server.

A field the model does not have, a value of the wrong type and a missing required field
all fail, with the path to the field.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the release the manifests are checked against (neuronserve.platforms.kubernetes)
WHEEL_DIR = Path(os.environ.get("NEURONSERVE_KSERVE_WHEELS", ROOT / ".venv" / "kserve-wheel"))


class KServeSchemaError(ValueError):
    pass


def _kserve_models() -> Any:
    if "kserve.models" in sys.modules:
        return sys.modules["kserve.models"]
    from neuronserve.platforms.kubernetes import KSERVE_VERSION

    wheel = WHEEL_DIR / f"kserve-{KSERVE_VERSION}-py3-none-any.whl"
    if not wheel.is_file():
        raise FileNotFoundError(
            f"{wheel} is missing: scripts/install.sh downloads it (pip download --no-deps "
            f"kserve=={KSERVE_VERSION})"
        )
    dest = WHEEL_DIR / f"kserve-{KSERVE_VERSION}"
    if not (dest / "kserve" / "models").is_dir():
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(("kserve/models/", "kserve/configuration.py")):
                    z.extract(name, dest)
    # the package, without running its __init__ (which starts importing the server)
    pkg = types.ModuleType("kserve")
    pkg.__path__ = [str(dest / "kserve")]
    sys.modules["kserve"] = pkg
    return importlib.import_module("kserve.models")


def _model(name: str) -> type:
    models = _kserve_models()
    if hasattr(models, name):
        return getattr(models, name)
    import kubernetes.client.models as k8s_models

    if hasattr(k8s_models, name):
        return getattr(k8s_models, name)
    raise KServeSchemaError(f"no API model named {name}")


_LIST = re.compile(r"^list\[(.+)\]$")
# kserve's models write dict(str, str), the Kubernetes client's dict[str, str]
_DICT = re.compile(r"^dict[(\[](\w+), (.+)[)\]]$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


def _check(value: Any, kind: str, path: str) -> Any:
    """`value` checked against OpenAPI type `kind`; returns what the model's constructor
    takes (a model instance for a model type)."""
    if kind == "object":
        return value
    if kind in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[kind]) and not (
            kind in ("int", "float") and isinstance(value, bool)
        )
        if not ok:
            raise KServeSchemaError(f"{path}: {value!r} is not {kind}")
        return value
    m = _LIST.match(kind)
    if m:
        if not isinstance(value, list):
            raise KServeSchemaError(f"{path}: expected a list of {m.group(1)}")
        return [_check(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(value)]
    m = _DICT.match(kind)
    if m:
        if not isinstance(value, dict):
            raise KServeSchemaError(f"{path}: expected a map of {m.group(2)}")
        return {k: _check(v, m.group(2), f"{path}.{k}") for k, v in value.items()}
    return _instance(value, _model(kind), path)


def _instance(value: Any, model: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise KServeSchemaError(f"{path}: expected an object ({model.__name__})")
    by_json = {j: p for p, j in model.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        if key not in by_json:
            raise KServeSchemaError(f"{path}.{key}: {model.__name__} has no field {key!r}")
        py = by_json[key]
        kwargs[py] = _check(v, model.openapi_types[py], f"{path}.{key}")
    try:
        return model(**kwargs)
    except ValueError as e:  # a required field missing, a value outside its enum
        raise KServeSchemaError(f"{path}: {e}") from None


KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
}


def validate_kserve(obj: dict[str, Any]) -> None:
    """Raise KServeSchemaError unless `obj` is a valid KServe object of a known kind."""
    name = KINDS.get((obj.get("apiVersion"), obj.get("kind")))
    if name is None:
        raise KServeSchemaError(f"not a KServe kind this checks: {obj.get('apiVersion')}")
    _instance(obj, _model(name), obj["kind"])
