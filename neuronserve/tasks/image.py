"""Image tasks (ViT and the architectures that trace the same way): image-classification
(labels and scores like the transformers pipeline, top 5 by default) and
image-feature-extraction (one vector per image: the CLS token or the mean of all tokens).

A request holds encoded images (bytes); the Runner opens them and runs the model's image
processor over the whole batch (images.py), and the one execution path runs the pixel
rows in buckets of batch sizes at the model's image size.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import RequestError, Task, TaskRequest, WrappedModel, logits_over_labels
from .feature_extraction import FeatureExtraction
from .text_classification import TextClassification, multi_label

if TYPE_CHECKING:
    import torch


class ImageTask(Task):
    images = True

    def decode(
        self, body: Any, content_type: str | None, max_depth: int = 32
    ) -> tuple[Any, dict[str, Any]]:
        from ..images import decode_images

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
