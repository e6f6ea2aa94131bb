"""text-embeddings-inference's OpenAPI document (`tei_openapi.json`: its
`docs/openapi.json`, version 1.9.3, commit 06670157fb6c1523482219bdb2d1660277d38088 of
that file in huggingface/text-embeddings-inference, copied unchanged) and the check of an
answer against it."""

from __future__ import annotations

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
    root = {**schema, "components": DOCUMENT["components"]}
    errors = list(OAS30Validator(root).iter_errors(response.json()))
    assert not errors, f"{method} {path} {status}: {errors[0].message} in {response.text[:300]}"
