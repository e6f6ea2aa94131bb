"""Request and response bodies of the front's routes, as pydantic models.

Requests are validated straight from the body bytes (`parse_body`, pydantic's Rust JSON
parser, which also bounds nesting depth); the OpenAPI document is generated from these
same models (openapi.py), and the tests check every answer against its response model.
Field names follow the APIs clients already speak: OpenAI's embeddings, and
text-embeddings-inference's /embed, /predict, /rerank, /tokenize and /info.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    FailFast,
    Field,
    RootModel,
    ValidationError,
    model_validator,
)

from ...names import NAME, safe_name
from ...quantization import EmbeddingType
from ...tasks import RequestError
from .errors import SYNTAX

Direction = Literal["right", "left", "Right", "Left"]


class _FailFast(FailFast):
    # hashable, so that a union can hold the annotated type (typing hashes its members)
    def __hash__(self) -> int:
        return hash(FailFast)


# A list a client sends stops at its first wrong item: 500,000 wrong items are one error
# to report, not 500,000 (each named would cost the event loop and the answer with them)
Texts = Annotated[list[str], _FailFast()]
# a text as token ids (TEI's InputType), decoded by the model's tokenizer
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], _FailFast()]
# TEI's Input: one text (or token ids), or a list of them
Inputs = str | TokenIds | Annotated[list[str | TokenIds], _FailFast()]
# at most this many problems are named in one 400
MAX_PROBLEMS = 10


def model_name(value: str) -> str:
    """A name a caller registers or manages a model by: the rule every model name follows
    (names.safe_name: letters, digits, '_', '.', '-', at most 128, starting with a letter
    or digit), checked before anything is built from it; a 400 naming the rule."""
    try:
        return safe_name(value)
    except ValueError as e:
        raise RequestError(str(e)) from None


class Body(BaseModel):
    # an unknown field, or a value of the wrong type ("yes" for a bool), is an error naming
    # the field, not something quietly ignored or coerced
    model_config = ConfigDict(extra="forbid", strict=True)


def parse_body(body: bytes, model: type[Body]) -> Any:
    """`model` from JSON bytes, or a 400 naming each field that is wrong."""
    if not body:
        raise RequestError("request body is empty: send a JSON object", kind=SYNTAX)
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        syntax = any(err["type"] == "json_invalid" for err in e.errors(include_url=False)[:1])
        raise RequestError(validation_message(e), kind=SYNTAX if syntax else None) from None


def validation_message(e: ValidationError) -> str:
    problems: dict[str, list[str]] = {}
    for err in e.errors(include_url=False)[: MAX_PROBLEMS * 4]:
        # union members add their type name to the location; the field is what matters
        loc = [str(p) for p in err["loc"] if not str(p).startswith(("list[", "str", "int"))]
        field = ".".join(loc) or "body"
        if err["type"] == "json_invalid":
            return f"request body is not valid JSON: {err['msg']}"
        problems.setdefault(field, [])
        if err["msg"] not in problems[field]:
            problems[field].append(err["msg"])
    named = list(problems.items())[:MAX_PROBLEMS]
    more = e.error_count() - sum(len(m) for _, m in named)
    return "; ".join(f"{field}: {' or '.join(msgs)}" for field, msgs in named) + (
        f" (and {more} more)" if more > 0 and len(problems) > MAX_PROBLEMS else ""
    )


class Truncation(Body):
    model: str | None = Field(
        None,
        description="which served model answers (GET /info lists them): needed when several "
        "served models fit this route",
    )

    @model_validator(mode="before")
    @classmethod
    def _options_in_parameters(cls, data: Any) -> Any:
        """huggingface_hub's InferenceClient (and the clients built on it, such as
        LangChain's) sends the options in a "parameters" object: the same fields."""
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            data = dict(data)
            options = data.pop("parameters")
            twice = sorted(set(options) & set(data))
            if twice:
                raise ValueError(f"{twice} given both at the top level and in parameters")
            data.update(options)
        return data

    truncate: bool | None = Field(
        None,
        description="cut a text longer than the model's longest compiled sequence instead "
        "of refusing it with 413 (default: the deployment's `truncation`)",
    )
    truncation_direction: Direction = Field("right", description="which end to cut")

    def parameters(self) -> dict[str, Any]:
        if self.truncate is None:
            return {}
        return {
            "truncate": self.truncate,
            "truncation_direction": self.truncation_direction.lower(),
        }


# OpenAI


class Chunking(Body):
    overlap: int = Field(0, ge=0, description="tokens of text consecutive chunks share")
    pooling: Literal["mean", "max", "none"] = Field(
        "mean",
        description="mean: the chunks' vectors averaged, each weighted by the tokens of text "
        "it holds; max: their elementwise max; none: every chunk's vector with its span (the "
        "text's tokens it holds, from, to); pooled vectors are normalised as the model does",
    )


class Chunked(Body):
    chunking: Chunking | bool | None = Field(
        None,
        description="an extension: a text longer than the largest compiled length is split "
        "into chunks of that length (on token boundaries, the special tokens in each) that "
        "run as rows of the same batches, and answered as one vector (or each chunk's); "
        "`true` takes the defaults. Usage counts every token the model read",
    )

    def chunking_parameter(self) -> dict[str, Any] | bool | None:
        """The task parameter `chunking` (checked again by the task, as /invocations'
        parameters are)."""
        c = self.chunking
        return c.model_dump() if isinstance(c, Chunking) else (c or None)


class Quantized(Body):
    """An extension of the embedding routes: each vector quantized as
    sentence-transformers' quantize_embeddings does (the model's calibration ranges for
    int8 and uint8, unless the request gives its own), after `dimensions`."""

    embedding_type: EmbeddingType = Field(
        "float32",
        description="an extension: float32, int8 or uint8 (a value per dimension, by each "
        "dimension's range), binary or ubinary (a bit per dimension, packed eight to a value; "
        "binary as int8)",
    )
    quantization_ranges: list[list[float]] | None = Field(
        None,
        description="an extension: int8 and uint8 by these ranges, [minimums, maximums] of "
        "the vectors' dimensions, instead of the model's calibration (GET /info shows it)",
    )


class OpenAIEmbeddingsRequest(Quantized, Chunked):
    input: Inputs = Field(description="one text or a list of texts (or token ids)")
    model: str | None = Field(
        None,
        description="the served model to use (GET /v1/models lists them); optional when one "
        "embedding model is served",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="float: lists of numbers; base64: each vector's bytes (little-endian "
        "float32, or one byte a value for the other embedding types)",
    )
    dimensions: int | None = Field(
        None, ge=1, description="keep the first N dimensions and L2-normalise again (Matryoshka)"
    )
    user: str | None = Field(None, description="accepted for compatibility, not used")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class OpenAIModels(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


# text-embeddings-inference

PROMPT = (
    "the name of one of the model's sentence-transformers prompts (GET /info lists them), "
    "put before each text; unset: the model's default prompt, if it has one"
)


class EmbedAllRequest(Truncation):
    inputs: Inputs = Field(description="one text or a list of texts (or token ids)")
    prompt_name: str | None = Field(None, description=PROMPT)


class EmbedSparseRequest(EmbedAllRequest):
    pass


class EmbedRequest(EmbedAllRequest, Quantized, Chunked):
    normalize: bool = Field(True, description="L2-normalise each embedding")
    dimensions: int | None = Field(
        None, ge=1, description="keep the first N dimensions (then normalise, if asked)"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="an extension: float, lists of numbers; base64, each vector's bytes "
        "(little-endian float32, or one byte a value for the other embedding types)",
    )


EmbedResponse = RootModel[list[list[float]] | list[str]]
EmbedAllResponse = RootModel[list[list[list[float]]]]


class SparseValue(BaseModel):
    index: int = Field(description="the term's token id")
    value: float = Field(description="its weight (only terms that weigh anything are listed)")


EmbedSparseResponse = RootModel[list[list[SparseValue]]]


class SimilarityInput(Body):
    source_sentence: str = Field(description="the text the others are compared with")
    sentences: Texts = Field(description="the texts compared with source_sentence")


class SimilarityRequest(Truncation):
    inputs: SimilarityInput
    prompt_name: str | None = Field(None, description=PROMPT)


SimilarityResponse = RootModel[list[float]]


class DecodeRequest(Body):
    model: str | None = Field(
        None, description="which served model's tokenizer: needed when several are served"
    )
    ids: TokenIds | Annotated[list[TokenIds], _FailFast()] = Field(
        description="one text's token ids, or a list of them"
    )
    skip_special_tokens: bool = True


DecodeResponse = RootModel[list[str]]


class PredictRequest(Truncation):
    inputs: str | Annotated[list[str | list[str]], _FailFast()] = Field(
        description='a text, a pair ["text", "text pair"], or a list of texts and pairs'
    )
    raw_scores: bool = Field(False, description="logits instead of probabilities")


class Prediction(BaseModel):
    score: float
    label: str


PredictResponse = RootModel[list[Prediction] | list[list[Prediction]]]


class RerankRequest(Truncation):
    query: str
    texts: Texts = Field(description="the documents to rank against the query")
    raw_scores: bool = Field(False, description="the model's logit instead of its sigmoid")
    return_text: bool = Field(False, description="include each document in the answer")
    top_n: int | None = Field(None, ge=1, description="answer only the N best")


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


RerankResponse = RootModel[list[Rank]]


# Cohere's and Jina's rerank APIs (what LangChain's, LlamaIndex's and Haystack's
# rerankers speak): Cohere's /v2/rerank, and /v1/rerank where Cohere's v1 and Jina's agree


class _RerankApi(Body):
    model: str = Field(description="the served reranker to use (GET /v1/models lists them)")
    query: str = Field(description="the text the documents are ranked against")
    top_n: int | None = Field(None, ge=1, description="answer only the N most relevant")
    max_tokens_per_doc: int | None = Field(
        None,
        ge=1,
        description="cut each document after this many tokens before it is paired with the "
        "query; a pair still longer than the model reads is cut or refused as `truncation` "
        "says",
    )


class CohereRerankRequest(_RerankApi):
    """Cohere's v2 rerank body (cohere.ClientV2.rerank)."""

    documents: Texts = Field(description="the texts to rank")
    priority: int | None = Field(None, description="accepted for compatibility, not used")
    return_documents: bool = Field(
        False, description="an extension: each result holds its document ({text})"
    )


class RerankDocument(Body):
    text: str


class RerankV1Request(_RerankApi):
    """Cohere's v1 and Jina's rerank body: documents as texts or as {"text": ...}."""

    documents: Annotated[list[str | RerankDocument], _FailFast()] = Field(
        description="the texts to rank, each a string or an object with a `text` field"
    )
    return_documents: bool = Field(
        True, description="each result holds its document ({text}), as Jina answers by default"
    )
    rank_fields: list[Literal["text"]] | None = Field(
        None, description="Cohere v1's: the field of an object document ranked (`text`)"
    )

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class CohereMeta(BaseModel):
    api_version: dict[str, str]
    billed_units: dict[str, int]
    tokens: dict[str, int]


class CohereRerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    meta: CohereMeta


class RerankV1Response(CohereRerankResponse):
    model: str
    usage: RerankUsage


class RerankError(BaseModel):
    message: str
    detail: str


class TokenizeRequest(Body):
    model: str | None = Field(
        None, description="which served model's tokenizer: needed when several are served"
    )
    inputs: str | Texts
    add_special_tokens: bool = True
    prompt_name: str | None = Field(None, description=PROMPT)


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="character offset of the token in its text")
    stop: int | None


TokenizeResponse = RootModel[list[list[Token]]]

ErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TEIError(BaseModel):
    error: str
    error_type: ErrorType


class Info(BaseModel):
    """text-embeddings-inference's Info (its required fields first), then neuronserve's."""

    model_id: str = Field(description="the model's name here (its artifact's, or the spec's)")
    model_sha: str | None = Field(description="the artifact's manifest digest (sha256)")
    model_dtype: str = Field(description="the precision the compiled model computes in")
    served_model_name: str
    model_type: dict[str, Any] = Field(
        description='{"embedding": {"pooling"}}, {"classifier": {"id2label", "label2id"}} or '
        '{"reranker": {...}} as text-embeddings-inference spells them; other tasks '
        '{"<task>": {...}}'
    )
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int = Field(description="the largest bucket's tokens (batch x sequence)")
    max_batch_requests: int | None = Field(description="the largest compiled batch")
    max_client_batch_size: int
    auto_truncate: bool = Field(description="whether over-long text is cut by default")
    tokenization_workers: int = Field(description="tokenizers per worker (one)")
    version: str = Field(description="neuronserve's version")
    sha: str | None = None
    docker_label: str | None = None
    task: str
    target: str
    precision: str
    prompts: dict[str, str] = Field(description="the prompts prompt_name chooses from")
    default_prompt_name: str | None
    batch_sizes: list[int]
    sequence_lengths: list[int]
    truncation: bool = Field(description="the same as auto_truncate")
    versions: dict[str, str]
    embedding_types: list[str] | None = Field(
        None, description="an embedder's: the embedding_type values a request may ask for"
    )
    calibration: dict[str, Any] | None = Field(
        None,
        description="an embedder's calibration of int8 and uint8 answers: how many texts, "
        "from where, and each dimension's [minimum, maximum] of their vectors as served by "
        "default (null: a request gives quantization_ranges)",
    )
    models: list[dict[str, Any]] = Field(
        default_factory=list,
        description="every served model, each with the fields above (the top level is the "
        "first model's)",
    )


class Health(BaseModel):
    status: Literal["ok", "degraded", "loading", "unhealthy"]
    workers_ready: int
    workers_expected: int
    # on a 503: text-embeddings-inference's ErrorResponse
    error: str | None = None
    error_type: ErrorType | None = None


# SageMaker's and the native request's contract


class NativeRequest(BaseModel):
    inputs: Any = Field(description="a text, a list of texts, or pairs for classification")
    parameters: dict[str, Any] | None = Field(
        None, description="task parameters (top_k, truncate, truncation_direction, ...)"
    )


class NativeError(BaseModel):
    code: int
    error: str


# SageMaker's multi-model contract (and the swap beside it)


class LoadModelRequest(Body):
    model_name: Annotated[str, AfterValidator(safe_name)] = Field(
        description="the name to serve it under: letters, digits, '_', '.' and '-', starting "
        "with a letter or digit, at most 128 characters (the rule of every model name)",
        json_schema_extra={"pattern": f"^{NAME.pattern}$"},
    )
    url: str = Field(
        min_length=1,
        description="a folder on this host holding a neuronserve artifact, or a .tar.gz of one",
    )


class SwapModelRequest(Body):
    url: str = Field(min_length=1, description="the new artifact's folder (or .tar.gz)")


class ListedModel(BaseModel):
    modelName: str
    modelUrl: str
    state: Literal["loading", "ready", "evicted"] = Field(
        description="ready: on every worker; evicted: registered, loads on its next request"
    )


class ModelListing(BaseModel):
    models: list[ListedModel]
    nextPageToken: str | None = Field(None, description="pass as next_page_token for the next page")
