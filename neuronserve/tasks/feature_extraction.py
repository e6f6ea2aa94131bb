"""feature-extraction: one embedding per text, pooled inside the compiled module.

Pooling runs in the module so padded positions are excluded by the attention mask
on every target, and the server moves one vector per text instead of a matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .base import (
    FLOAT32_JSON_BYTES,
    RequestError,
    RowOutputs,
    Task,
    TaskRequest,
    WrappedModel,
    boolean,
    stacked,
)
from .sentence_transformers import DenseLayer, read_modules, read_prompts

if TYPE_CHECKING:
    import torch

    from ..tokenization import Encoded


def load_dense(model_dir: Path, layers: tuple[DenseLayer, ...], allow_pickle: bool) -> Any:
    """sentence-transformers' Dense modules of `model_dir` as one torch module (None when
    there are none), weights read from each module's model.safetensors."""
    if not layers:
        return None
    import torch

    from .heads import dense_layers

    loaded = []
    for layer in layers:
        folder = Path(model_dir) / layer.folder
        state = _dense_weights(folder, allow_pickle)
        linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        linear.load_state_dict(
            {k.removeprefix("linear."): v for k, v in state.items() if k.startswith("linear.")}
        )
        loaded.append((linear, layer.activation))
    return dense_layers(loaded).eval()


def _dense_weights(folder: Path, allow_pickle: bool) -> dict[str, Any]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        if not allow_pickle:
            raise ValueError(
                f"the Dense module in {folder} holds its weights only in pytorch_model.bin, a "
                "Python pickle that can run code: convert it to model.safetensors, or pass "
                "--allow-pickle-weights for a model you trust"
            )
        import torch

        return torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    raise ValueError(f"the Dense module in {folder} has no weights (model.safetensors)")


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row L2-normalised (sentence-transformers' Normalize; a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cosines(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """Lowest and mean cosine of each compiled embedding to its eager one."""
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cos = np.sum(got * want, axis=1) / np.maximum(norms, 1e-12)
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}


TOKEN_EMBEDDINGS = "TOKEN_EMBEDDINGS"
# how a long text's chunks become its answer: their mean weighted by the tokens of text
# each holds, their elementwise max, or every chunk's vector with its span ("none")
CHUNK_POOLING = ("mean", "max", "none")
# the task setting saying the model's answers are L2-normalised by default, outside its
# compiled module (a request may ask for them as they are: `normalize: false`)
NORMALIZE = "normalize"


class FeatureExtraction(Task):
    """One embedding per text; with an artifact compiled with token embeddings, every
    token's vector instead when a request asks (`token_embeddings`: /embed_all)."""

    auto_class = "AutoModel"
    name = "feature-extraction"
    accepts_pairs = False
    parameters = frozenset({"prompt_name", "token_embeddings", "normalize", "chunking"})
    takes_prompts = True

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        out = dict(parameters)
        tokens = boolean(parameters, "token_embeddings", False)
        if parameters.get("normalize") is not None:
            boolean(parameters, "normalize", True)
        if parameters.get("chunking") not in (None, False):
            if tokens:
                raise RequestError("chunking and token_embeddings cannot be asked together")
            out["chunking"] = chunking(parameters["chunking"])
        else:
            out.pop("chunking", None)
        return out

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        st = read_modules(model_dir)
        pooling = options.get("pooling", "auto")
        if pooling == "auto":
            pooling = st.pooling or "cls"
        normalize = options.get("normalize")
        if normalize is None:
            normalize = st.normalize
        tokens = bool(options.get("token_embeddings"))
        from .heads import PooledEncoder

        dense = load_dense(model_dir, st.dense, bool(options.get("allow_pickle_weights")))
        # the module stops before Normalize: the worker normalises each answer unless its
        # request says `normalize: false` (text-embeddings-inference's default, and what
        # it answers otherwise), so one artifact serves both
        module = PooledEncoder(model, pooling, False, options["input_names"], dense, tokens).eval()
        return WrappedModel(
            module=module,
            output_name="embedding",
            manifest_fields={
                "pooling": pooling,
                "normalize": normalize,
                "labels": None,
                "token_embeddings": tokens,
                "task_settings": {NORMALIZE: normalize},
                **prompt_fields(model_dir),
            },
        )

    accuracy_metric = "min_cosine"
    accuracy_floor_field = "min_cosine"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        # a token-embeddings module's rows: every pooled and every token vector compared
        return {**super().accuracy(got, want), **cosines(stacked(got), stacked(want))}

    def check_encoded(
        self, encoded: Sequence[Sequence[Encoded]], request: TaskRequest, info: dict[str, Any]
    ) -> RequestError | None:
        if request.parameters.get("token_embeddings") and not info.get("token_embeddings"):
            return RequestError(
                "this model was compiled without every token's vector: compile it with "
                "--token-embeddings to serve token embeddings (/embed_all)",
                status=424,
            )
        return None

    def answer_bytes(
        self, tokens: Sequence[int], parameters: dict[str, Any], info: dict[str, Any]
    ) -> tuple[int, str] | None:
        if not parameters.get("token_embeddings"):
            return None
        dim = int(info["output_dim"])
        return sum(tokens) * dim * FLOAT32_JSON_BYTES, f"{sum(tokens)} tokens x {dim} numbers"

    def finish(
        self,
        outputs: RowOutputs,
        encoded: Sequence[Sequence[Encoded]],
        request: TaskRequest,
        info: dict[str, Any],
    ) -> Any:
        if request.parameters.get("chunking") and not isinstance(outputs, list):
            return self._pooled_chunks(outputs, encoded, request, info)
        if not isinstance(outputs, list):
            return self._normalized(outputs, request, info)  # pooled vectors only
        # each text's rows: its pooled vector, then one per token (as they came)
        if request.parameters.get("token_embeddings"):
            return [rows[1:] for rows in outputs]
        return self._normalized(np.stack([rows[0] for rows in outputs]), request, info)

    def _pooled_chunks(
        self,
        rows: np.ndarray,
        encoded: Sequence[Sequence[Encoded]],
        request: TaskRequest,
        info: dict[str, Any],
    ) -> Any:
        """Each text's answer from its chunks' vectors (the module's, before Normalize):
        pooled as the request asked, then normalised as the model does; or, for pooling
        "none", every chunk's vector so normalised, with the text's tokens it holds."""
        pooling, at = request.parameters["chunking"]["pooling"], 0
        out: list[Any] = []
        for chunks in encoded:
            vectors, at = rows[at : at + len(chunks)], at + len(chunks)
            spans = [cast(tuple[int, int], c.span) for c in chunks]
            if pooling == "none":
                vectors = self._normalized(vectors, request, info)
                out.append(
                    [
                        {"embedding": v, "span": list(sp)}
                        for v, sp in zip(vectors, spans, strict=True)
                    ]
                )
            elif pooling == "max":
                out.append(vectors.max(axis=0))
            else:
                held = np.asarray([max(1, stop - start) for start, stop in spans], dtype=np.float64)
                out.append((vectors * held[:, None]).sum(axis=0) / held.sum())
        if pooling == "none":
            return out
        return self._normalized(np.stack(out).astype(np.float32), request, info)

    @staticmethod
    def _normalized(vectors: np.ndarray, request: TaskRequest, info: dict[str, Any]) -> Any:
        """The pooled vectors L2-normalised where the model's sentence-transformers
        config says so and the request does not say `normalize: false`. An artifact
        compiled before normalising moved out of the module (no NORMALIZE setting)
        answers as its module does."""
        if NORMALIZE not in info:
            return vectors
        wanted = request.parameters.get("normalize")
        if not (info[NORMALIZE] if wanted is None else wanted):
            return vectors
        return normalized(vectors)

    def respond(self, outputs: Any, request: TaskRequest, info: dict[str, Any]) -> Any:
        if (request.parameters.get("chunking") or {}).get("pooling") == "none":
            return outputs[0] if request.single else outputs  # each text's chunks
        # float32 arrays, not lists of Python floats: orjson writes each number in the
        # fewest digits that read back as the same float32 (as TEI does), about half the
        # bytes of a float64's 17 digits, and without a Python object per number
        vectors = (
            [np.ascontiguousarray(rows, dtype=np.float32) for rows in outputs]
            if isinstance(outputs, list)
            else np.ascontiguousarray(outputs, dtype=np.float32)
        )
        return vectors[0] if request.single else vectors


def chunking(value: Any) -> dict[str, Any]:
    """A request's `chunking` checked, with its defaults: `true`, or an object of
    `overlap` (tokens consecutive chunks share, default 0) and `pooling` (CHUNK_POOLING,
    default "mean")."""
    given = {} if value is True else value
    if not isinstance(given, dict) or set(given) - {"overlap", "pooling"}:
        raise RequestError(
            '"chunking" must be true or an object of "overlap" (tokens consecutive chunks '
            f'share) and "pooling" ({", ".join(CHUNK_POOLING)}), got {value!r}'
        )
    overlap, pooling = given.get("overlap", 0), given.get("pooling", "mean")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or overlap < 0:
        raise RequestError(
            f'"chunking.overlap" must be a whole number of tokens >= 0, got {overlap!r}'
        )
    if pooling not in CHUNK_POOLING:
        raise RequestError(
            f'"chunking.pooling" must be one of {", ".join(CHUNK_POOLING)}, got {pooling!r}'
        )
    return {"overlap": overlap, "pooling": pooling}


def prompt_fields(model_dir: Path) -> dict[str, Any]:
    """What the manifest records of the model's sentence-transformers prompts."""
    prompts = read_prompts(model_dir)
    return {"prompts": prompts.prompts, "default_prompt_name": prompts.default}
