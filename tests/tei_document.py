"""text-embeddings-inference's OpenAPI document (`tei_openapi.json`: its
`docs/openapi.json`, version 1.9.3, commit 06670157fb6c1523482219bdb2d1660277d38088 of
that file in huggingface/text-embeddings-inference, copied unchanged) and the check of an
answer against it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from openapi_schema_validator import OAS30Validator

DOCUMENT = json.loads((Path(__file__).parent / "tei_openapi.json").read_text())
# sentence-transformers prompts of the test embedder (conftest's tei_models)
PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["What is Deep Learning?", "Deep learning is a subset of machine learning.", "a"]


def conforms(path: str, method: str, response: Any) -> None:
    """The answer's status is one TEI documents for the route, and its JSON body fits
    the schema TEI gives for that status."""
    documented = DOCUMENT["paths"][path][method.lower()]["responses"]
    status = str(response.status_code)
    assert status in documented, f"{method} {path}: {status} is not among {sorted(documented)}"
    schema = documented[status].get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        return
    errors = list(_validator(path, method, status).iter_errors(_sampled(response.json())))
    assert not errors, f"{method} {path} {status}: {errors[0].message} in {response.text[:300]}"


@functools.cache
def _validator(path: str, method: str, status: str) -> OAS30Validator:
    documented = DOCUMENT["paths"][path][method.lower()]["responses"][status]
    schema = documented["content"]["application/json"]["schema"]
    return OAS30Validator({**schema, "components": DOCUMENT["components"]})


# a longer list of numbers, or of objects of numbers (a SPLADE model's whole vocabulary
# vector, its terms), is checked item by item here to be of one shape, and by the schema on
# its head: the schema's walk over tens of thousands of items costs seconds per answer
SAMPLE = 64


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _one_shape(items: list[Any]) -> bool:
    if all(_number(v) for v in items):
        return True
    if not all(isinstance(v, dict) for v in items):
        return False
    keys = items[0].keys()
    return all(v.keys() == keys and all(_number(x) for x in v.values()) for v in items)


def _sampled(value: Any) -> Any:
    if isinstance(value, list):
        if len(value) > SAMPLE and _one_shape(value):
            return value[:SAMPLE]
        return [_sampled(v) for v in value]
    if isinstance(value, dict):
        return {k: _sampled(v) for k, v in value.items()}
    return value
