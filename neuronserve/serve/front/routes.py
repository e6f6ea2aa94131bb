"""The front's routes: each turns one API's request into a native request for the
workers (`Serving.predict`) and their answer into that API's response.

The table at the bottom (`endpoints`, of `route.Route`s) is the one list of routes:
Starlette routes by it,
the guard reads which routes need a key and count against the in-flight bound, and the
OpenAPI document is generated from the bodies it names.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import orjson
from prometheus_client import generate_latest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ...quantization import VectorForm, packed, typed
from ...served import ServedModel
from ...tasks import RequestError, TaskRequest, get_task
from ...tasks.base import RequestLimits, Text
from ...tasks.feature_extraction import NORMALIZE, normalized
from ...workers.answers import Answer, WorkersUnavailable
from . import schemas as s
from .errors import Family, error_response
from .observe import FrontMetrics
from .openapi import SWAGGER_FILES, SWAGGER_PAGE, document, swagger_file
from .reranking import cohere_meta, cut_documents, ranked, results
from .route import Handler, Route
from .schemas import model_name
from .serving import ANY_MODEL, MODEL_BASE, Need, NotReady, Serving, off_loop
from .tei import (
    cosine_similarities,
    decoded,
    dense_bytes,
    sparse_as_dense,
    sparse_cosine_similarities,
    texts_of,
)

if TYPE_CHECKING:
    from .multi_model import ModelCatalog

log = logging.getLogger("neuronserve.front")

# where the guard leaves each request's id in its ASGI scope, and a route the name of the
# model the request was for (the metrics' `model` label)
REQUEST_ID = "neuronserve.request_id"
MODEL = "neuronserve.model"
# the scope key of the model a request's base URL names (/models/<name>/...)
PATH_MODEL = "neuronserve.path_model"
JSON = "application/json"
# what an image model's /invocations takes besides JSON and image/* bodies
IMAGE_BODIES = ("multipart/form-data", "application/octet-stream", "application/x-image")
# how long a client should wait before retrying while the model loads or is replaced
RETRY_AFTER_S = "5"
# most tokens one /tokenize answer lists (about 4 MB of JSON)
TOKENIZE_MAX_TOKENS = 65_536


def json_response(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), status, media_type=JSON)


def raw_json(data: bytes, status: int = 200) -> Response:
    return Response(data, status, media_type=JSON)


def guarded(family: Family, fn: Handler) -> Handler:
    """`fn` with the errors a route expects turned into answers in its family's shape."""

    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except RequestError as e:
            # a worker's queue is full (or a request waited past its queue timeout)
            busy = {"Retry-After": RETRY_AFTER_S} if e.status in (429, 503) else None
            return error_response(family, e.status, e.message, busy, e.kind)
        except NotReady:
            return error_response(
                family, 503, "the model is still loading", {"Retry-After": RETRY_AFTER_S}
            )
        except WorkersUnavailable as e:
            log.warning("request %s: %s", request.scope.get(REQUEST_ID, "-"), e)
            return error_response(
                family, 503, "the model server is not answering", {"Retry-After": RETRY_AFTER_S}
            )

    return endpoint


# which models each route applies to
EMBEDDINGS = Need.of("feature-extraction")
SPARSE = Need(("sparse-embedding",), None, "a SPLADE model (pooling splade)")
# dense vectors of either (a SPLADE model's with normalize off, as TEI's /embed)
EMBEDDERS = Need.of("feature-extraction", "sparse-embedding")
CLASSIFIER = Need.of("text-classification")
RERANKER = Need(
    ("rerank", "text-classification"),
    lambda m: m.task == "rerank" or len(m.manifest.labels or []) == 1,
    "a cross-encoder (a rerank model, or a classifier with one label)",
)
TEXT_MODEL = Need((), lambda m: m.tokenizer is not None, "a text model")
# what SageMaker sends a multi-model endpoint's container: the caller's TargetModel
TARGET_MODEL = "x-amzn-sagemaker-target-model"


class Api:
    def __init__(self, serving: Serving, metrics: FrontMetrics):
        self.serving, self.metrics = serving, metrics

    async def _model(  # noqa: PLR0913 - the request, its route, and how it names a model
        self,
        request: Request,
        route: str,
        name: str | None,
        need: Need,
        ask: str | None = None,
        default: bool = False,
    ) -> ServedModel:
        """The model this request is for (Serving.lookup: held until the request ends),
        noted for the metrics: the one its base URL names (a request's own `model` field
        is then ignored, as a text-embeddings-inference serving one model ignores it), else
        the one it names."""
        name = request.scope.get(PATH_MODEL) or name
        model = await self.serving.lookup(
            route, name, need, request.scope, ask or "the request's `model` field", default
        )
        request.scope[MODEL] = model.name
        return model

    def at_base_url(self, handler: Handler) -> Handler:
        """`handler` answering for the model its base URL names (/models/<name>/...)."""

        async def scoped(request: Request) -> Response:
            request.scope[PATH_MODEL] = model_name(request.path_params["name"])
            return await handler(request)

        scoped.__name__ = handler.__name__
        return scoped

    # OpenAI

    async def openai_embeddings(self, request: Request) -> Response:
        body: s.OpenAIEmbeddingsRequest = s.parse_body(
            await request.body(), s.OpenAIEmbeddingsRequest
        )
        model = await self._model(request, "/v1/embeddings", body.model, EMBEDDINGS)
        texts = await _texts(model, body.input, "input")
        dims = _dimensions(model, body.dimensions)
        each_chunk = _each_chunk(body, dims)
        prediction = await self.serving.predict(model, texts, _chunked({}, body))
        if each_chunk:
            tokens = await self.serving.count_tokens(model, texts, prediction)
            each = [
                {"object": "embedding", "index": i, "embedding": c["embedding"], "span": c["span"]}
                for i, chunks in enumerate(prediction.value)
                for c in chunks
            ]
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            return json_response(
                {"object": "list", "data": each, "model": model.name, "usage": usage}
            )
        vectors = _vectors(prediction)
        if dims is not None:
            vectors = normalized(vectors[:, :dims])
        # the steps those vectors took from the model's pooled ones (its int8 ranges')
        form = VectorForm(_normalizes(model), dims, again=True)
        vectors = _typed(model, vectors, body, form)
        tokens = await self.serving.count_tokens(model, texts, prediction)
        if body.encoding_format == "base64":
            data: list[Any] = packed(vectors)
        else:
            data = list(vectors)  # float32 rows, written in float32's shortest digits
        return json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)
                ],
                "model": model.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def openai_models(self, request: Request) -> Response:
        self.serving.ready()
        alone = request.scope.get(PATH_MODEL)
        if alone is not None:
            names = [(await self._model(request, "/v1/models", alone, ANY_MODEL)).name]
        else:
            names = self.serving.table.names()
        return json_response(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "neuronserve"}
                    for name in names
                ],
            }
        )

    # text-embeddings-inference

    async def own_task(self, request: Request) -> Response:
        """TEI's POST /: the route of the model's own task answers, so
        huggingface_hub's InferenceClient pointed at the server's root (or at a model's
        base URL) works. The model: the base URL's, else the one the body names, else the
        only one whose task's route takes the body, else the default model. It never
        asks: TEI serves one model per URL, and its clients post to it as given."""
        body = await request.body()
        named = request.scope.get(PATH_MODEL) or _named(body)
        if self.serving.catalog is not None and named is not None:
            await self.serving.catalog.ensure(named)
        model = self.serving.model("/", named, ANY_MODEL) if named else self._taking(body)
        request.scope[PATH_MODEL] = model.name  # the task's route answers for it
        route = {
            "feature-extraction": self.embed,
            "sparse-embedding": self.embed_sparse,
            "text-classification": self.predict,
            "rerank": self.rerank,
        }.get(model.task, self.invocations)
        return await route(request)

    def _taking(self, body: bytes) -> ServedModel:
        """The only served model whose task's route takes `body` (a query and texts are a
        cross-encoder's, say), else the default model."""
        self.serving.ready()
        taking = [m for m in self.serving.models.values() if _takes(m.task, body)]
        if len(taking) == 1:
            return taking[0]
        chosen = self.serving.default_model()
        if chosen is None:
            raise NotReady
        return chosen

    async def embed(self, request: Request) -> Response:
        body: s.EmbedRequest = s.parse_body(await request.body(), s.EmbedRequest)
        model = await self._model(request, "/embed", body.model, EMBEDDERS)
        texts = await _texts(model, body.inputs, "inputs", body.parameters())
        dims = _dimensions(model, body.dimensions)
        if model.task == "sparse-embedding" and body.normalize:
            raise RequestError(
                "normalize is not available for SPLADE models: send normalize: false for the "
                "whole vector of term weights, or use /embed_sparse",
                status=424,
            )
        # the worker normalises (or not, as asked) an artifact whose module stops before
        # Normalize; one compiled with Normalize inside cannot undo it
        outside = NORMALIZE in model.manifest.task_settings
        if model.manifest.normalize and not outside and not body.normalize:
            raise RequestError(
                f"{model.name} was compiled with normalising inside its module (by an "
                "earlier neuronserve): compile it again to serve normalize: false",
                status=424,
            )
        params = _chunked({**body.parameters(), **_prompt(body.prompt_name)}, body)
        if outside:
            params["normalize"] = body.normalize
        quantized = _quantized(body) or body.encoding_format == "base64"
        each_chunk = _each_chunk(body, dims)
        if model.task == "feature-extraction" and dims is None:
            prediction = await self.serving.predict(model, texts, params)
            as_answered = outside or body.normalize == bool(model.manifest.normalize)
            if (as_answered and not quantized) or each_chunk:
                return raw_json(prediction.raw)
            vectors = _vectors(prediction)
            if not as_answered:
                vectors = normalized(vectors)
        else:
            vectors = await self._dense(model, texts, params)
            if dims is not None:
                vectors = np.ascontiguousarray(vectors[:, :dims])
            if body.normalize:
                vectors = normalized(vectors)
        if not quantized:
            return json_response(vectors)
        form = VectorForm(body.normalize, dims, again=body.normalize)
        vectors = _typed(model, vectors, body, form)
        return json_response(packed(vectors) if body.encoding_format == "base64" else vectors)

    async def _dense(
        self, model: ServedModel, texts: list[str], params: dict[str, Any]
    ) -> np.ndarray:
        """The embeddings of `texts` as one float32 array (a SPLADE model's as the whole
        vector of term weights)."""
        if model.task != "sparse-embedding":
            return _vectors(await self.serving.predict(model, texts, params))
        # a whole vector of term weights per text: bounded before and after the workers
        # call (texts x vocabulary float32 in the front, and as JSON)
        size, limits = model.manifest.output_dim, self.serving.config.answer_limits
        what = f"{len(texts)} texts x {size} term weights"
        refused = limits.check_answer(dense_bytes(len(texts), size), what)
        if refused is not None:
            raise refused
        answer = (await self.serving.predict(model, texts, params)).value
        terms = sum(len(t) for t in answer)
        refused = limits.check_answer(dense_bytes(len(texts), size, terms), what)
        if refused is not None:
            raise refused
        return sparse_as_dense(answer, size)

    async def embed_all(self, request: Request) -> Response:
        body: s.EmbedAllRequest = s.parse_body(await request.body(), s.EmbedAllRequest)
        model = await self._model(request, "/embed_all", body.model, EMBEDDINGS)
        if not model.manifest.token_embeddings:
            raise RequestError(
                f"{model.name} was compiled without every token's vector: compile it with "
                "--token-embeddings to serve /embed_all",
                status=424,
            )
        texts = await _texts(model, body.inputs, "inputs", body.parameters())
        params = {**body.parameters(), **_prompt(body.prompt_name), "token_embeddings": True}
        # every token's vector: a 200 KB request could ask for hundreds of MB. A worker
        # bounds its call's answer from the tokens it read; a request in several calls
        # is bounded whole here, before any
        if len(texts) > model.max_batch:
            counts = await self.serving.token_counts(model, texts)
            found = get_task(model.task).answer_bytes(counts, params, model.manifest.task_info())
            refused = self.serving.config.answer_limits.check_answer(*found) if found else None
            if refused is not None:
                raise refused
        return raw_json((await self.serving.predict(model, texts, params)).raw)

    async def embed_sparse(self, request: Request) -> Response:
        body: s.EmbedSparseRequest = s.parse_body(await request.body(), s.EmbedSparseRequest)
        model = await self._model(request, "/embed_sparse", body.model, SPARSE)
        texts = await _texts(model, body.inputs, "inputs", body.parameters())
        params = {**body.parameters(), **_prompt(body.prompt_name)}
        return raw_json((await self.serving.predict(model, texts, params)).raw)

    async def similarity(self, request: Request) -> Response:
        body: s.SimilarityRequest = s.parse_body(await request.body(), s.SimilarityRequest)
        model = await self._model(request, "/similarity", body.model, EMBEDDERS)
        if not body.inputs.sentences:
            raise RequestError(
                "inputs.sentences is an empty list: send at least one text", kind="Empty"
            )
        texts = [body.inputs.source_sentence, *body.inputs.sentences]
        params = {**body.parameters(), **_prompt(body.prompt_name)}
        if model.task == "sparse-embedding":  # from the terms: no texts x vocabulary
            answer = (await self.serving.predict(model, texts, params)).value
            return json_response(sparse_cosine_similarities(answer))
        vectors = await self._dense(model, texts, params)
        return json_response(cosine_similarities(vectors[0], vectors[1:]))

    async def decode(self, request: Request) -> Response:
        body: s.DecodeRequest = s.parse_body(await request.body(), s.DecodeRequest)
        model = await self._model(request, "/decode", body.model, TEXT_MODEL, default=True)
        one = not body.ids or isinstance(body.ids[0], int)
        batch = cast(list[list[int]], [body.ids] if one else body.ids)
        if not batch:
            raise RequestError("ids is an empty list: send at least one text's ids", kind="Empty")
        if len(batch) > self.serving.config.max_client_batch:
            raise self.serving.too_many(len(batch))
        skip = body.skip_special_tokens
        texts = await off_loop(
            lambda: [decoded(model, ids, f"ids[{i}]", skip) for i, ids in enumerate(batch)],
            sum(len(ids) for ids in batch),
        )
        return json_response(texts)

    async def predict(self, request: Request) -> Response:
        body: s.PredictRequest = s.parse_body(await request.body(), s.PredictRequest)
        model = await self._model(request, "/predict", body.model, CLASSIFIER)
        items, single = predict_inputs(body.inputs)
        params = {
            "top_k": None,
            "function_to_apply": "none" if body.raw_scores else None,
            **body.parameters(),
        }
        answers = (await self.serving.predict(model, items, params)).value
        return json_response(answers[0] if single else answers)

    async def rerank(self, request: Request) -> Response:
        body: s.RerankRequest = s.parse_body(await request.body(), s.RerankRequest)
        # the query read once per text is bounded where every route's requests are
        # (RequestLimits.total_chars), before anything is tokenized
        model = await self._model(request, "/rerank", body.model, RERANKER)
        if not body.texts:
            raise RequestError("texts is an empty list: send at least one document", kind="Empty")
        result = await ranked(
            self.serving, model, body.query, body.texts, body.top_n, body.raw_scores,
            body.parameters(),
        )  # fmt: skip
        return json_response(
            [
                {
                    "index": i,
                    "score": score,
                    **({"text": body.texts[i]} if body.return_text else {}),
                }
                for i, score in result.order
            ]
        )

    # Cohere's and Jina's rerank APIs

    async def cohere_rerank(self, request: Request) -> Response:
        """Cohere's /v2/rerank (cohere.ClientV2, and the rerankers built on it)."""
        body: s.CohereRerankRequest = s.parse_body(await request.body(), s.CohereRerankRequest)
        model = await self._model(request, "/v2/rerank", body.model, RERANKER)
        texts = cut_documents(model, body.documents, body.max_tokens_per_doc)
        result = await ranked(self.serving, model, body.query, texts, body.top_n)
        return json_response(
            {
                "id": request.scope[REQUEST_ID],
                "results": results(result, body.documents, body.return_documents),
                "meta": cohere_meta(result, len(texts), "2"),
            }
        )

    async def rerank_v1(self, request: Request) -> Response:
        """/v1/rerank: Cohere's v1 and Jina's, one answer holding what each reads."""
        body: s.RerankV1Request = s.parse_body(await request.body(), s.RerankV1Request)
        model = await self._model(request, "/v1/rerank", body.model, RERANKER)
        sent = body.texts()
        texts = cut_documents(model, sent, body.max_tokens_per_doc)
        result = await ranked(self.serving, model, body.query, texts, body.top_n)
        return json_response(
            {
                "id": request.scope[REQUEST_ID],
                "model": model.name,
                "results": results(result, sent, body.return_documents),
                "meta": cohere_meta(result, len(texts), "1"),
                "usage": {"total_tokens": result.tokens},
            }
        )

    async def tokenize(self, request: Request) -> Response:
        body: s.TokenizeRequest = s.parse_body(await request.body(), s.TokenizeRequest)
        model = await self._model(request, "/tokenize", body.model, TEXT_MODEL, default=True)
        tokenizer = model.tokenizer
        assert tokenizer is not None  # TEXT_MODEL
        texts: list[str] = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        if not texts:
            raise RequestError("inputs is an empty list: send at least one text", kind="Empty")
        limits = RequestLimits(self.serving.config.max_client_batch, model.max_text_chars)
        refused = limits.check(TaskRequest(texts=list(texts), single=False))
        if refused is not None:
            raise refused
        texts = cast(list[str], model.prompted(cast(list[Text], texts), body.prompt_name))
        tokens = await off_loop(
            lambda: tokenizer.tokens(texts, body.add_special_tokens),
            sum(len(t) for t in texts),
        )
        # the answer is ~60 bytes a token: bounded by what the model reads (as
        # text-embeddings-inference refuses a text over its max input length) and in all
        for i, row in enumerate(tokens):
            if len(row) > tokenizer.max_length:
                raise RequestError(
                    f"input {i} has {len(row)} tokens; {model.name} reads at most "
                    f"{tokenizer.max_length}",
                    status=413,
                )
        total = sum(len(row) for row in tokens)
        if total > TOKENIZE_MAX_TOKENS:
            raise RequestError(
                f"{total} tokens in one request; /tokenize answers at most "
                f"{TOKENIZE_MAX_TOKENS}: send fewer texts per request",
                status=413,
            )
        return json_response(tokens)

    async def info(self, request: Request) -> Response:
        """The default model's Info (or `?model=`'s) and every model's with its base URL;
        at a model's base URL, that model's alone."""
        alone = request.scope.get(PATH_MODEL)
        named = alone or request.query_params.get("model")
        if named is not None:
            await self._model(request, "/info", named, ANY_MODEL)
        return json_response(self.serving.info(named, alone=alone is not None))

    async def health(self, request: Request) -> Response:
        alone = request.scope.get(PATH_MODEL)
        status, body = await self._health()
        if alone is not None and status == 200 and alone not in self.serving.models:
            # a model this front does not serve (any more): 404, naming no other (the
            # route is open: it must not list what a client without a key cannot see)
            raise RequestError(f"no model {alone!r} here", status=404)
        if status == 503:
            # text-embeddings-inference's ErrorResponse fields, beside the counts
            body = {**body, "error": f"no worker can serve ({body['status']})",
                    "error_type": "Unhealthy"}  # fmt: skip
        return json_response(body, status)

    async def _health(self) -> tuple[int, dict[str, Any]]:
        if self.serving.client is None or self.serving.starting:
            return 503, {"status": "loading", "workers_ready": 0, "workers_expected": 0}
        h = await self.serving.health()
        body = {
            # degraded: some workers down (one that died, being replaced) and the others
            # serving, so a probe keeps the front in rotation: 503 only when none can
            "status": "ok" if h.ok else ("degraded" if h.ready else "unhealthy"),
            "workers_ready": h.ready,
            "workers_expected": h.expected,
        }
        return (200 if h.ready else 503), body

    # SageMaker

    async def ping(self, request: Request) -> Response:
        status, body = await self._health()
        said = body["status"]
        return json_response({"status": "ready" if said == "ok" else said}, status)

    async def invocations(self, request: Request) -> Response:
        self.serving.ready()
        model = await self._model(
            request,
            "/invocations",
            _target_model(request),
            ANY_MODEL,
            "the X-Amzn-SageMaker-Target-Model header",
        )
        return await self._invoke(request, model)

    async def _invoke(self, request: Request, model: ServedModel) -> Response:
        content_type = request.headers.get("content-type") or JSON
        kind = content_type.split(";")[0].strip().lower()
        task = model.handler
        if task.images:
            if kind != JSON and not kind.startswith("image/") and kind not in IMAGE_BODIES:
                raise RequestError(
                    f"unsupported Content-Type {content_type}: send the image (image/jpeg, "
                    "image/png, ...), a multipart/form-data upload or application/json",
                    status=415,
                )
        elif kind not in (JSON, "text/plain"):
            raise RequestError(
                f"unsupported Content-Type {content_type}: send application/json or text/plain",
                status=415,
            )
        body = await request.body()
        inputs, parameters = task.decode(body, content_type, self.serving.config.max_json_depth)
        asked = _invocation_quantization(model, parameters)
        answer = await self.serving.predict(model, inputs, parameters)
        if asked is None:
            return raw_json(answer.raw)
        single = isinstance(answer.value, np.ndarray) and answer.value.ndim == 1
        vectors = np.asarray(answer.value, dtype=np.float32).reshape(-1, model.manifest.output_dim)
        normalize = parameters.get("normalize")
        form = VectorForm(_normalizes(model) if normalize is None else bool(normalize))
        typed_rows = _typed(model, vectors, asked, form)
        rows = packed(typed_rows) if asked.encoding_format == "base64" else list(typed_rows)
        return json_response(rows[0] if single else rows)

    # SageMaker's multi-model contract

    def _catalog(self) -> ModelCatalog:
        self.serving.ready()
        if self.serving.catalog is None:
            raise RequestError(
                "this server serves a fixed set of models: start it with multi_model: true "
                "(SAGEMAKER_MULTI_MODEL=true in the container) to load models at run time",
                status=404,
            )
        return self.serving.catalog

    async def load_model(self, request: Request) -> Response:
        body = s.parse_body(await request.body(), s.LoadModelRequest)
        entry = await self._catalog().register(body.model_name, body.url)
        return json_response(entry.listed())

    async def list_models(self, request: Request) -> Response:
        query = request.query_params
        token = query.get("next_page_token") or query.get("nextPageToken")
        size = query.get("max_results") or query.get("maxResults")
        # ASCII digits only: str.isdigit also takes "²", which int() refuses
        if size is not None and not (size.isascii() and size.isdigit() and int(size) > 0):
            raise RequestError(f"max_results must be a positive integer, not {size!r}")
        return json_response(self._catalog().page(token, int(size) if size else None))

    async def get_model(self, request: Request) -> Response:
        return json_response(self._catalog().describe(request.path_params["name"]))

    async def unload_model(self, request: Request) -> Response:
        name = request.path_params["name"]
        await self._catalog().unregister(name)
        return json_response({"modelName": name, "status": "unloaded"})

    async def swap_model(self, request: Request) -> Response:
        body = s.parse_body(await request.body(), s.SwapModelRequest)
        entry = await self._catalog().swap(request.path_params["name"], body.url)
        return json_response(entry.listed())

    async def invoke_model(self, request: Request) -> Response:
        """The name in the path is the model; SageMaker's X-Amzn-SageMaker-Target-Model
        (the caller's TargetModel) is only logged."""
        name = model_name(request.path_params["name"])
        self._catalog()
        target = request.headers.get(TARGET_MODEL)
        if target:
            log.debug("invoke %s (TargetModel %s)", name, target)
        model = await self._model(request, "/models/{name}/invoke", name, ANY_MODEL)
        return await self._invoke(request, model)

    # operations

    async def prometheus(self, request: Request) -> Response:
        text = generate_latest(self.metrics.registry)
        if self.serving.client is not None:
            workers = self.metrics.workers_text(await self.serving.client.metrics())
            text += b"# the workers' own metrics\n"
            text += workers.encode()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: Request) -> Response:
        config = self.serving.config
        return json_response(
            document(endpoints(self, config.metrics_auth), config.keys is not None)
        )

    async def docs(self, request: Request) -> Response:
        return HTMLResponse(SWAGGER_PAGE)

    async def docs_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        data = swagger_file(name)
        if data is None:
            raise RequestError(f"no file {name} here: the page is /docs", status=404)
        return Response(data, media_type=SWAGGER_FILES[name])


def _target_model(request: Request) -> str | None:
    """The model SageMaker's X-Amzn-SageMaker-Target-Model header names: a model's name,
    or the name of its archive in S3 (`<name>.tar.gz`)."""
    target = request.headers.get(TARGET_MODEL)
    if not target:
        return None
    return target.removesuffix(".tar.gz")


def _chunked(params: dict[str, Any], body: s.Chunked) -> dict[str, Any]:
    """`params` with the body's `chunking`, when it asks for it."""
    chunking = body.chunking_parameter()
    return {**params, "chunking": chunking} if chunking else params


def _each_chunk(body: s.Chunked, dims: int | None) -> bool:
    """Whether the body asks for every chunk's vector (which comes as the model answers
    it: floats, every dimension)."""
    if not (isinstance(body.chunking, s.Chunking) and body.chunking.pooling == "none"):
        return False
    if (
        dims is not None
        or _quantized(cast(s.Quantized, body))
        or getattr(body, "encoding_format", "float") != "float"
    ):
        raise RequestError(
            'chunking.pooling "none" answers each chunk\'s float vector as the model gives it: '
            "send it without dimensions, embedding_type or encoding_format base64",
            status=422,
        )
    return True


def _dimensions(model: ServedModel, dims: int | None) -> int | None:
    if dims is not None and dims > model.manifest.output_dim:
        raise RequestError(
            f"dimensions is {dims}, more than this model's {model.manifest.output_dim}"
        )
    return dims


def _normalizes(model: ServedModel) -> bool:
    """Whether the model's answers are L2-normalised unless a request says otherwise."""
    m = model.manifest
    return bool(m.task_settings.get(NORMALIZE, m.normalize))


def _quantized(body: s.Quantized) -> bool:
    return body.embedding_type != "float32" or body.quantization_ranges is not None


def _typed(
    model: ServedModel, vectors: np.ndarray, body: s.Quantized, form: VectorForm
) -> np.ndarray:
    """`vectors` (in `form`) as the request's embedding_type (quantization.typed); a 422
    for a model whose answers are not an embedder's vectors."""
    if not _quantized(body):
        return vectors
    if model.task != "feature-extraction":
        raise RequestError(
            f"embedding_type and quantization_ranges apply to an embedder's dense vectors "
            f"(feature-extraction); {model.name} is a {model.task} model, answered as float32 "
            "only (send embedding_type float32, or leave it out)",
            status=422,
        )
    return typed(
        vectors, body.embedding_type, form, model.calibration, body.quantization_ranges,
        model.name,
    )  # fmt: skip


class _InvocationQuantization(s.Quantized):
    encoding_format: Literal["float", "base64"] = "float"


QUANTIZATION_PARAMETERS = frozenset(_InvocationQuantization.model_fields)


def _invocation_quantization(
    model: ServedModel, parameters: dict[str, Any]
) -> _InvocationQuantization | None:
    """The quantization /invocations' parameters ask for (taken out of them; None: none),
    checked as /embed checks the same fields."""
    given = {k: parameters.pop(k) for k in list(parameters) if k in QUANTIZATION_PARAMETERS}
    if not given:
        return None
    if model.task != "feature-extraction" or parameters.get("token_embeddings"):
        what = (
            "every token's vector, as float32"
            if model.task == "feature-extraction"
            else f"{model.task} answers, not embeddings"
        )
        raise RequestError(
            f"{', '.join(sorted(given))}: for an embedder's pooled vectors; {model.name} "
            f"answers {what}: leave them out",
            status=422,
        )
    try:
        return _InvocationQuantization.model_validate(given)
    except ValidationError as e:
        raise RequestError(f"parameters: {s.validation_message(e)}", status=422) from None


def _vectors(prediction: Answer) -> np.ndarray:
    return np.asarray(prediction.value, dtype=np.float32).reshape(len(prediction.value), -1)


async def _texts(
    model: ServedModel, inputs: Any, field: str, cut: dict[str, Any] | None = None
) -> list[str]:
    """The texts of TEI's Input (tei.texts_of): token ids are decoded off the event loop
    when there are many."""
    ids = 0
    if not isinstance(inputs, str):
        ids = sum(1 if isinstance(i, int) else len(i) for i in inputs if not isinstance(i, str))
    texts, _ = await off_loop(lambda: texts_of(model, inputs, field, cut), ids)
    return cast(list[str], texts)


def _prompt(prompt_name: str | None) -> dict[str, str]:
    """The request parameter that names a prompt (the worker puts it before each text)."""
    return {} if prompt_name is None else {"prompt_name": prompt_name}


def predict_inputs(inputs: str | list[str | list[str]]) -> tuple[list[Any], bool]:
    """(native inputs, whether one input was sent) by text-embeddings-inference's rule:
    a string is one text; a list of exactly two strings is one pair; any other list is
    a batch whose items are texts, one-string lists or two-string pairs."""
    if isinstance(inputs, str):
        return [inputs], True
    if len(inputs) == 2 and all(isinstance(x, str) for x in inputs):
        return [{"text": inputs[0], "text_pair": inputs[1]}], True
    if not inputs:
        raise RequestError("inputs is an empty list: send at least one text", kind="Empty")
    items: list[Any] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            items.append(item)
        elif len(item) == 1:  # TEI's batch item: a text alone in a list, or a pair
            items.append(item[0])
        elif len(item) == 2:
            items.append({"text": item[0], "text_pair": item[1]})
        else:
            raise RequestError(f"inputs[{i}] must be a text or a pair of two texts")
    return items, False


# the schema of the route each task's POST / goes to (others: /invocations, which takes
# any JSON)
_ROOT_SCHEMAS: dict[str, type[s.Body]] = {
    "feature-extraction": s.EmbedRequest,
    "sparse-embedding": s.EmbedSparseRequest,
    "text-classification": s.PredictRequest,
    "rerank": s.RerankRequest,
}


def _takes(task: str, body: bytes) -> bool:
    """Whether the route of `task`'s POST / takes `body` as it is."""
    schema = _ROOT_SCHEMAS.get(task)
    if schema is None:
        return True
    try:
        s.parse_body(body, schema)
    except RequestError:
        return False
    return True


def _named(body: bytes) -> str | None:
    """The `model` a JSON body names, if any (the route it goes to parses the rest and
    says what is wrong with it)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    name = parsed.get("model") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) else None


def endpoints(api: Api, metrics_auth: bool = True) -> list[Route]:
    """Every route of the front, in the order the documentation lists them: then each
    model's base URL, /models/<name>, with every TEI and OpenAI route under it."""
    routes = _routes(api, metrics_auth)
    return routes + [per_model(api, r) for r in routes if r.family in ("openai", "tei", "rerank")]


def per_model(api: Api, route: Route) -> Route:
    """`route` under a model's base URL (/models/<name>/embed, ...; its POST / at
    /models/<name>): answering for that model as a TEI serving it alone would."""
    path = MODEL_BASE + (route.path if route.path != "/" else "")
    return dataclasses.replace(
        route,
        path=path,
        handler=api.at_base_url(route.handler),
        summary=f"{route.summary}, of the model named in the path (its own base URL)",
        tag="per model",
    )


def _routes(api: Api, metrics_auth: bool) -> list[Route]:
    # long: the one table of routes, a row each
    e = Route
    tei = "text-embeddings-inference"
    return [
        e("/v1/embeddings", "POST", api.openai_embeddings, "openai", "OpenAI embeddings",
          "OpenAI", s.OpenAIEmbeddingsRequest, s.OpenAIEmbeddingsResponse, s.OpenAIError,
          infers=True),
        e("/v1/models", "GET", api.openai_models, "openai", "The served models, as OpenAI "
          "lists models", "OpenAI", None, s.OpenAIModels, s.OpenAIError),
        e("/", "POST", api.own_task, "tei", "The model's own task, as text-embeddings-"
          "inference answers POST /: /embed for an embedder, /embed_sparse for a SPLADE "
          "model, /predict for a classifier, /rerank for a cross-encoder (query, texts), "
          "/invocations for the other tasks", tei, None, None,
          s.TEIError, infers=True),
        e("/embed", "POST", api.embed, "tei", "Embeddings", tei, s.EmbedRequest,
          s.EmbedResponse, s.TEIError, infers=True),
        e("/embed_all", "POST", api.embed_all, "tei", "Every token's vector (a model "
          "compiled with --token-embeddings)", tei, s.EmbedAllRequest, s.EmbedAllResponse,
          s.TEIError, infers=True),
        e("/embed_sparse", "POST", api.embed_sparse, "tei", "Sparse embeddings: each text's "
          "terms with their weights (a SPLADE model)", tei, s.EmbedSparseRequest,
          s.EmbedSparseResponse, s.TEIError, infers=True),
        e("/similarity", "POST", api.similarity, "tei", "Cosine similarity of each sentence "
          "to the source sentence", tei, s.SimilarityRequest, s.SimilarityResponse,
          s.TEIError, infers=True),
        e("/predict", "POST", api.predict, "tei", "Classify texts or text pairs", tei,
          s.PredictRequest, s.PredictResponse, s.TEIError, infers=True),
        e("/rerank", "POST", api.rerank, "tei", "Rank documents against a query "
          "(a cross-encoder: a classifier with one label)", tei, s.RerankRequest,
          s.RerankResponse, s.TEIError, infers=True),
        e("/v2/rerank", "POST", api.cohere_rerank, "rerank", "Rank documents against a query, "
          "as Cohere's v2 rerank API answers (cohere.ClientV2, LangChain's, LlamaIndex's "
          "and Haystack's Cohere rerankers)", "Cohere and Jina", s.CohereRerankRequest,
          s.CohereRerankResponse, s.RerankError, infers=True),
        e("/v1/rerank", "POST", api.rerank_v1, "rerank", "Rank documents against a query, "
          "as Cohere's v1 and Jina's rerank APIs answer (documents as texts or {text})",
          "Cohere and Jina", s.RerankV1Request, s.RerankV1Response, s.RerankError,
          infers=True),
        e("/tokenize", "POST", api.tokenize, "tei", "The model's tokens for texts", tei,
          s.TokenizeRequest, s.TokenizeResponse, s.TEIError),
        e("/decode", "POST", api.decode, "tei", "The text of token ids", tei,
          s.DecodeRequest, s.DecodeResponse, s.TEIError),
        e("/info", "GET", api.info, "tei", "The served model: task, buckets, precision, "
          "versions", tei, None, s.Info, s.TEIError),
        e("/health", "GET", api.health, "tei", "200 while a worker serves (`degraded` while "
          "some are down), 503 when none can",
          "operations", None, s.Health, s.Health, open=True, probe=True),
        e("/ping", "GET", api.ping, "native", "SageMaker health: 200 once every worker is "
          "warm, and while any serves", "SageMaker", open=True, probe=True),
        e("/invocations", "POST", api.invocations, "native", "SageMaker inference: "
          "{inputs, parameters} as JSON, or plain text", "SageMaker", s.NativeRequest,
          None, s.NativeError, infers=True),
        e("/models", "POST", api.load_model, "native", "Load a model (SageMaker's "
          "multi-model contract): 409 for a loaded name, 507 when it cannot fit", "models",
          s.LoadModelRequest, s.ListedModel, s.NativeError, admin=True, loads=True),
        e("/models", "GET", api.list_models, "native", "The loaded models, a page at a "
          "time (next_page_token, max_results)", "models", None, s.ModelListing,
          s.NativeError, admin=True),
        e("/models/{name}", "GET", api.get_model, "native", "One loaded model", "models",
          None, s.ListedModel, s.NativeError, admin=True),
        e("/models/{name}", "DELETE", api.unload_model, "native", "Unload a model; "
          "requests in flight finish", "models", None, None, s.NativeError, admin=True,
          loads=True),
        e("/models/{name}", "PUT", api.swap_model, "native", "Serve another artifact "
          "under this name without dropping a request", "models", s.SwapModelRequest,
          s.ListedModel, s.NativeError, admin=True, loads=True),
        e("/models/{name}/invoke", "POST", api.invoke_model, "native", "Inference on one "
          "model, as /invocations", "models", s.NativeRequest, None, s.NativeError, infers=True),
        e("/metrics", "GET", api.prometheus, "native", "Prometheus metrics of the front "
          "and of the workers behind it", "operations",
          open=not metrics_auth, probe=True),
        e("/openapi.json", "GET", api.openapi, "native", "This document", "operations",
          open=True),
        e("/docs", "GET", api.docs, "native", "API documentation page", "operations",
          open=True),
        e("/docs/{name}", "GET", api.docs_file, "native", "The documentation page's own "
          "script and style (Swagger UI)", "operations", open=True),
    ]  # fmt: skip
