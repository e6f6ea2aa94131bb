"""Image tasks (ViT and the architectures that trace the same way): image-classification
(labels and scores like the transformers pipeline, top 5 by default) and
image-feature-extraction (one vector per image: the CLS token or the mean of all tokens).

A request holds encoded images (bytes); the Runner opens them and runs the model's image
processor over the whole batch (images.py), and the one execution path runs the pixel
rows in buckets of batch sizes at the model's image size.
"""

from __future__ import annotations

import base64
import binascii
import json
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import (
    RequestError,
    Task,
    TaskRequest,
    WrappedModel,
    decode_payload,
    logits_over_labels,
)
from .feature_extraction import FeatureExtraction
from .text_classification import TextClassification, multi_label

if TYPE_CHECKING:
    import torch


class ImageTask(Task):
    images = True

    def decode(
        self, body: Any, content_type: str | None, max_depth: int = 32
    ) -> tuple[Any, dict[str, Any]]:
        return decode_images(body, content_type, max_depth)

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> TaskRequest:
        single = not isinstance(inputs, list)
        items = [inputs] if single else inputs
        if not items:
            raise RequestError("no image in the request: send at least one")
        for i, item in enumerate(items):
            if not isinstance(item, (bytes, bytearray)):
                raise RequestError(
                    f"image {i} must be encoded image bytes, got {type(item).__name__}"
                )
        return TaskRequest(
            texts=[bytes(x) for x in items],
            single=single,
            parameters=self.own_parameters(parameters),
        )


class ImageClassification(ImageTask, TextClassification):
    auto_class = "AutoModelForImageClassification"
    name = "image-classification"
    accepts_pairs = False

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        # the image-classification pipeline answers the 5 best labels unless told
        return super().check_parameters({"top_k": 5, **parameters})

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import PixelModule

        config: Any = model.config
        return logits_over_labels(
            PixelModule(model, "logits"), config, multi_label=multi_label(config)
        )

    accuracy_metric = "top1_agreement"
    accuracy_floor_field = "min_top1_agreement"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        out = super().accuracy(got, want)
        return {**out, "top1_agreement": out["argmax_agreement"]}


class ImageFeatureExtraction(ImageTask, FeatureExtraction):
    """An embedding per image: answered, measured and sent to Triton as text embeddings."""

    name = "image-feature-extraction"
    auto_class = "AutoModel"

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import PixelModule

        pooling = options.get("pooling", "auto")
        pooling = "cls" if pooling == "auto" else pooling
        return WrappedModel(
            module=PixelModule(model, pooling).eval(),
            output_name="embedding",
            manifest_fields={"pooling": pooling, "normalize": False, "labels": None},
        )


# what an image request holds, decoded (a task's `decode`)


def decode_images(
    body: Any, content_type: str | None, max_depth: int = 32
) -> tuple[Any, dict[str, Any]]:
    """(images, parameters) of a request body: one image's raw bytes (any image/* type,
    or bytes that are not JSON), a multipart form (each file field an image, a field
    named "parameters" holding JSON), or JSON {"inputs": base64 | [base64, ...],
    "parameters": {...}} (data: URLs too). Images are bytes, or a list of them."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if isinstance(body, dict) and "inputs" not in body:
        return _form_fields(body)  # TorchServe hands a multipart form over as fields
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body)
        if kind == "multipart/form-data":
            return _multipart(body, content_type or "")
        if kind != "application/json" and body.lstrip()[:1] not in (b"{", b"["):
            if not body:
                raise RequestError("empty request body: send an image")
            return body, {}
    inputs, parameters = decode_payload(body, content_type, max_depth)
    if isinstance(inputs, list):
        if not inputs:
            raise RequestError('"inputs" is an empty list: send at least one image')
        return [_base64(x, f"inputs[{i}]") for i, x in enumerate(inputs)], parameters
    return _base64(inputs, "inputs"), parameters


def _base64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise RequestError(
            f"{where} must be a base64 string of an image, got {type(value).__name__}"
        )
    if value.startswith("data:"):
        value = value.split(",", 1)[-1]
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where} is not valid base64") from None


def _form_fields(fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    images = [
        bytes(v)
        for k, v in fields.items()
        if k != "parameters" and isinstance(v, (bytes, bytearray))
    ]
    return _form(images, fields.get("parameters"))


def _multipart(body: bytes, content_type: str) -> tuple[Any, dict[str, Any]]:
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise RequestError("multipart body without parts (is the boundary right?)")
    images: list[bytes] = []
    parameters = None
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        payload = payload if isinstance(payload, bytes) else b""
        if part.get_param("name", header="content-disposition") == "parameters":
            parameters = payload
        else:
            images.append(payload)
    return _form(images, parameters)


def _form(images: list[bytes], parameters: Any) -> tuple[Any, dict[str, Any]]:
    if not images:
        raise RequestError("multipart request without an image: send each image as a file field")
    params: Any = {}
    if parameters:
        try:
            params = json.loads(parameters)
        except (ValueError, UnicodeDecodeError):
            raise RequestError('the "parameters" field must hold a JSON object') from None
        if not isinstance(params, dict):
            raise RequestError('the "parameters" field must hold a JSON object')
    return (images[0] if len(images) == 1 else images), params
