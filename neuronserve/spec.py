"""One validated deployment spec shared by `compile`, `package` and `serve`, made of
sections each owned by the code that reads it.

    name, artifact | models, deployment_name, truncation   the deployment itself
    compile:     what `compile` builds (model, task, target, buckets, precision, ...)
    accuracy:    the floors a precision below fp32 must meet
    worker:      how many workers, of how many cores, and how they batch and queue
    limits:      what one request may hold and get back (the front and every worker)
    front:       the HTTP front: address, keys, TLS, bounds
    multi_model: SageMaker's multi-model contract
    triton, torchserve: what `package` writes for those servers (packaging/)

A spec comes from a YAML file, from command-line flags, or both; flags override the file
field by field. Every field is declared once, here or in its packager's section: its
description is the CLI's help and the generated reference, its `flags` the option that
sets it (cli/spec_options.py). A spec written in the earlier flat layout (every field at
the top) still loads: each flat field is moved to its section, with a note saying where.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .inflight import IN_FLIGHT
from .names import is_hub_id, safe_name
from .section import Section, declared, flags

Task = Literal[
    "feature-extraction",
    "sparse-embedding",
    "text-classification",
    "rerank",
    "token-classification",
    "question-answering",
    "fill-mask",
    "image-classification",
    "image-feature-extraction",
]
Target = Literal["cpu", "neuronx", "neuron"]
Pooling = Literal["auto", "mean", "cls", "splade"]
Precision = Literal["auto", "fp32", "bf16", "fp16", "int8"]
ModuleFormat = Literal["auto", "torchscript", "onnx", "openvino"]
Layout = Literal["throughput", "latency"]


# what `compile` records when the spec does not say (packaging then keeps the artifact's)
TRUNCATION_AT_COMPILE = True


class SpecError(ValueError):
    """A spec file or flag has a value neuronserve cannot use."""


def _ints(value: Any) -> Any:
    """'1,4,8' (a flag or a YAML string) -> [1, 4, 8]."""
    if isinstance(value, str):
        try:
            return [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"expected comma-separated integers, got {value!r}") from None
    return value


class CompileSection(Section):
    """What `neuronserve compile` builds: the model, its task and head, the target, the
    bucket grid, the precision and the library that builds it."""

    key = "compile"

    model: str | None = Field(
        None,
        description="a Hugging Face Hub id (org/name, or org/name@revision) or a local model "
        "folder (config.json, weights, a fast tokenizer); Hub models are downloaded with "
        "huggingface_hub (HF_TOKEN, HF_HOME, HF_HUB_OFFLINE apply)",
    )
    revision: str | None = Field(
        None,
        description="the Hub revision (branch, tag or commit) of `model`; default: main",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _folder_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, Path) else v

    task: Task = Field(
        "feature-extraction",
        description="feature-extraction | sparse-embedding (SPLADE) | text-classification | "
        "rerank (a cross-encoder) | "
        "token-classification (NER) | question-answering (extractive) | fill-mask | "
        "image-classification | image-feature-extraction (ViT)",
    )
    allow_pickle_weights: bool = Field(
        False,
        description="load a model whose weights are only in .bin (Python pickle) files; "
        "pickles can run code, so only for models you trust",
        json_schema_extra=flags("--allow-pickle-weights/--safetensors-only"),
    )
    allow_exported_module: bool = Field(
        False,
        description="serve a module compiled elsewhere (an optimum-neuron export's "
        "model.neuron) as it is; a TorchScript archive runs code of its own when loaded, so "
        "only for exports you trust: without this, such a model is refused (--recompile "
        "compiles its source model instead)",
        json_schema_extra=flags(
            "--allow-exported-module/--refuse-exported-module",
            env="NEURONSERVE_ALLOW_EXPORTED_MODULE",
        ),
    )
    recompile: bool = Field(
        False,
        description="a model optimum-neuron already compiled (model.neuron beside a config "
        "whose neuron section says how) is served as it is when --allow-exported-module "
        "says so; with this, its source model (the config's _name_or_path) is compiled over "
        "the grid instead",
        json_schema_extra=flags("--recompile/--as-exported"),
    )
    target: Target = Field(
        "cpu",
        description="cpu | neuronx (Inf2/Trn1) | neuron (Inf1); serving a model by Hub id or "
        "folder compiles for this host's (neuronx or neuron where it has NeuronCores)",
    )
    batch_sizes: list[int] = Field(
        default_factory=lambda: [1, 4, 8],
        description="compiled batch sizes, e.g. 1,4,8",
        # the Hugging Face Neuron container's one static shape: the largest here
        json_schema_extra=flags(env="HF_OPTIMUM_BATCH_SIZE", env_reads="largest"),
    )
    sequence_lengths: list[int] = Field(
        default_factory=lambda: [16, 32, 64, 128],
        description="compiled sequence lengths in tokens, e.g. 16,32,64,128",
        json_schema_extra=flags(env="HF_OPTIMUM_SEQUENCE_LENGTH", env_reads="largest"),
    )
    pooling: Pooling = Field(
        "auto",
        description="feature-extraction pooling: auto "
        "(sentence-transformers config, else cls), "
        "mean, cls, or splade (sparse term weights of a masked-LM model, for /embed_sparse: "
        "the sparse-embedding task; auto picks it for a SparseEncoder)",
    )
    normalize: bool | None = Field(
        None,
        description="L2-normalise embeddings (default: the sentence-transformers config)",
        json_schema_extra=flags("--normalize/--no-normalize"),
    )
    embedding_calibration: Path | None = Field(
        None,
        description="a file of texts, one a line, whose embeddings give each dimension's "
        "range for int8 and uint8 answers (embedding_type); default: a built-in set of "
        "varied texts",
    )
    token_embeddings: bool = Field(
        False,
        description="feature-extraction: compile every token's vector as well as the pooled "
        "one, for /embed_all (each call then also moves tokens x hidden floats per text off "
        "the device)",
        json_schema_extra=flags("--token-embeddings/--pooled-only"),
    )
    tolerance: float = Field(
        1e-3, gt=0, description="largest accepted |compiled - eager| per bucket at fp32"
    )
    precision: Precision = Field(
        "auto",
        description="what the compiled model computes in. cpu: fp32 | bf16 | int8 | auto (the "
        "fastest that meets the accuracy floor); neuronx: fp32 | bf16 | fp16 | auto (bf16 if "
        "it meets the floor, else fp32); neuron (Inf1): bf16 | fp16 | auto (bf16). Each "
        "candidate's accuracy is recorded in the manifest",
    )
    module_format: ModuleFormat = Field(
        "auto",
        description="cpu: which library's build of the precision to make: torchscript "
        "(torch.jit), onnx (ONNX Runtime, fused operators), openvino (OpenVINO; int8 "
        "calibrated by NNCF) or auto (every build the precision has; the fastest that meets "
        "the accuracy floor is kept)",
    )
    max_top_k: int = Field(
        10,
        ge=1,
        le=100,
        description="fill-mask: the most predictions per mask a request may ask for "
        "(top_k); the compiled module returns this many per token",
    )
    relevance_label: str | None = Field(
        None,
        description="rerank with a model of several labels: the label whose probability is "
        "the relevance score (one label: its sigmoid)",
    )
    # Neuron compiler options (targets neuronx and neuron)
    auto_cast: Literal["none", "matmult", "all"] | None = Field(
        None, description="Neuron: which operators the compiler casts down: none | matmult | all"
    )
    auto_cast_type: Literal["bf16", "fp16", "tf32"] | None = Field(
        None, description="Neuron: the type auto_cast casts to: bf16 | fp16 | tf32"
    )
    optlevel: Literal[1, 2, 3] | None = Field(None, description="neuronx-cc --optlevel 1-3")
    compiler_args: list[str] = Field(
        default_factory=list,
        description="extra compiler argument (repeat for several)",
        json_schema_extra=flags("--compiler-arg"),
    )
    pipeline_cores: int | Literal["auto"] | None = Field(
        None,
        description="Inf1 pipeline mode: NeuronCores per model, or auto (4*round(weights/2e7))",
    )
    compiler_workdir: Path | None = Field(
        None, description="keep the compiler's intermediate files here (one folder per bucket)"
    )
    compile_for: Literal["inf2", "trn1", "trn1n", "trn2"] | None = Field(
        None,
        description="neuronx: compile for inf2 | trn1 | trn1n | trn2 on a build host "
        "without Neuron devices (neuronx-cc --target)",
    )

    @classmethod
    def up_to(cls, field: str, largest: int) -> list[int]:
        """A grid axis (`batch_sizes` or `sequence_lengths`) whose largest is `largest`:
        the default buckets below it, then it. Where another server compiles one static
        shape, a short request here still runs at its own size."""
        factory = cls.model_fields[field].default_factory
        defaults: list[int] = factory() if factory is not None else []  # type: ignore[call-arg]
        return sorted({n for n in defaults if n < largest} | {largest})

    @field_validator("batch_sizes", "sequence_lengths", mode="before")
    @classmethod
    def _from_text(cls, v: Any) -> Any:
        return _ints(v)

    @field_validator("pipeline_cores", mode="before")
    @classmethod
    def _cores_from_text(cls, v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.isdigit() else v

    @field_validator("batch_sizes", "sequence_lengths")
    @classmethod
    def _positive_sorted_unique(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("needs at least one value")
        if any(x < 1 for x in v):
            raise ValueError(f"values must be positive, got {v}")
        return sorted(set(v))

    @field_validator("sequence_lengths")
    @classmethod
    def _room_for_special_tokens(cls, v: list[int]) -> list[int]:
        if v[0] < 4:
            raise ValueError("the smallest sequence length must be at least 4 (special tokens)")
        return v

    @model_validator(mode="after")
    def _neuron_options_need_neuron_target(self) -> CompileSection:
        neuron_only = {
            "auto_cast": self.auto_cast,
            "auto_cast_type": self.auto_cast_type,
            "optlevel": self.optlevel,
            "pipeline_cores": self.pipeline_cores,
            "compile_for": self.compile_for,
        }
        given = [k for k, v in neuron_only.items() if v is not None]
        if self.target == "cpu" and given:
            raise ValueError(
                f"{', '.join(given)} apply to the Neuron targets (neuronx, neuron), "
                "not to target cpu"
            )
        if self.target != "cpu" and self.module_format != "auto":
            raise ValueError(
                f"module_format {self.module_format} applies to target cpu; target "
                f"{self.target} builds one kind of module (leave module_format auto)"
            )
        return self

    def compiler_options(self, neuron_cores: int | None = None) -> dict[str, Any]:
        """The Neuron compiler's options; `neuron_cores` (the serving host's, when known)
        caps Inf1's pipeline_cores: auto."""
        return {
            "auto_cast": self.auto_cast,
            "auto_cast_type": self.auto_cast_type,
            "optlevel": self.optlevel,
            "compiler_args": list(self.compiler_args),
            "pipeline_cores": self.pipeline_cores,
            "compiler_workdir": self.compiler_workdir,
            "compile_for": self.compile_for,
            "neuron_cores": neuron_cores,
        }


class AccuracySection(Section):
    """The accuracy floors a precision below fp32 must meet against the fp32 eager model
    (compile's gate), one per kind of task."""

    key = "accuracy"

    min_cosine: float = Field(
        0.999,
        gt=0,
        le=1,
        description="feature-extraction (text and image) accuracy floor: lowest cosine to "
        "the fp32 eager embedding a non-fp32 precision may reach",
    )
    min_argmax_agreement: float = Field(
        0.99,
        gt=0,
        le=1,
        description="text-classification and token-classification accuracy floor: share "
        "of texts (tokens) whose top label must match the fp32 eager model's",
    )
    min_spearman: float = Field(
        0.99,
        gt=-1,
        le=1,
        description="rerank accuracy floor: Spearman rank correlation of the scores with "
        "the fp32 eager model's",
    )
    min_span_agreement: float = Field(
        0.99,
        gt=0,
        le=1,
        description="question-answering accuracy floor: share of texts whose best answer "
        "span must equal the fp32 eager model's",
    )
    min_top1_agreement: float = Field(
        0.99,
        gt=0,
        le=1,
        description="fill-mask and image-classification accuracy floor: share of tokens "
        "(images) whose most likely token (label) must equal the fp32 eager model's",
    )


class WorkerSection(Section):
    """The workers: how many, of how many cores, and how they batch and queue (our own
    server's, and what `package triton|torchserve` writes for those servers)."""

    key = "worker"

    layout: Layout = Field(
        "throughput",
        description="throughput: one single-core worker per core (default); "
        "latency: one worker using every core (workers and "
        "cores_per_worker refine throughput)",
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="worker processes (in a TorchServe store: its workers; in a Triton "
        "repository: model instances); default: one per core group",
        json_schema_extra=flags("--workers", "--instances", env="SAGEMAKER_MODEL_SERVER_WORKERS"),
    )
    cores_per_worker: int = Field(
        1,
        ge=1,
        description="cores leased by each worker or instance",
        json_schema_extra=flags(
            "--cores-per-worker", "--cores-per-instance", env="NEURONSERVE_CORES_PER_WORKER"
        ),
    )
    neuron_cores: int | None = Field(
        None,
        ge=1,
        description="NeuronCores of the serving host (default: discovered where workers start)",
    )
    max_batch_delay_ms: int = Field(
        0,
        ge=0,
        description="longest a worker holds a request to fill a batch (ms). 0 (default): "
        "never wait; a batch is whatever queued while the workers were busy, so a lone "
        "request runs at once and a loaded server still batches (TorchServe's least is "
        "1 ms: it reads 0 as its 100 ms default)",
    )
    response_timeout_s: int = Field(
        120,
        ge=1,
        description="seconds a request may take before its worker gives up on it",
        json_schema_extra=flags(env="SAGEMAKER_MODEL_SERVER_TIMEOUT"),
    )
    max_queued: int = Field(
        100,
        ge=1,
        description="requests that may wait for a worker (also TorchServe's job queue and "
        "Triton's dynamic-batching queue); beyond it a worker refuses at once (503) instead of "
        "letting latency grow without bound. Behind the front they are the front's calls: "
        "a request over the model's largest batch is several",
        json_schema_extra=flags(env="NEURONSERVE_MAX_QUEUED"),
    )
    queue_timeout_ms: int | None = Field(
        None,
        ge=1,
        description="longest a request may wait in a worker's queue before it is refused "
        "(503); default: no limit but response_timeout_s",
    )
    batches_in_flight: int = Field(
        IN_FLIGHT,
        ge=1,
        le=4,
        description="batches a worker on a Neuron target holds at once: 2 (default) keeps "
        "its NeuronCore busy while the host parses and answers the batch beside the one on "
        "the device; 1 answers each batch before taking the next. In a Triton repository, "
        "a batch held by an instance whose process dies (killed, out of memory) fails at "
        "once with 1; beyond the first, Triton never answers it: its clients' timeouts end "
        "it. TorchServe's workers hold one batch whatever this says",
    )

    @model_validator(mode="after")
    def _latency_layout_is_one_worker(self) -> WorkerSection:
        if self.layout == "latency" and ((self.workers or 1) != 1 or self.cores_per_worker != 1):
            raise ValueError(
                "layout latency runs one worker on every core: leave workers and "
                "cores_per_worker unset, or use layout throughput"
            )
        return self


class LimitsSection(Section):
    """What one request may hold and get back: checked by the front and by every worker
    (Triton's and TorchServe's adapters hold to them too)."""

    key = "limits"

    max_body_bytes: int = Field(
        2_000_000,
        ge=1,
        description="largest request body the front and TorchServe read (413 beyond)",
    )
    max_client_batch: int = Field(
        1024,
        ge=1,
        description="most inputs one request may hold (413 beyond)",
    )
    max_text_chars: int = Field(
        100_000,
        ge=1,
        description="most characters one text (or one side of a pair) may hold, checked "
        "before tokenizing (413 beyond)",
    )
    max_answer_bytes: int = Field(
        64 * 2**20,
        ge=2**20,
        description="largest answer one request may get, as JSON: every token's vector "
        "(/embed_all), a SPLADE model's whole vectors; refused (413) before the model runs "
        "when its tokens say it would be larger, so one cheap request cannot make a worker "
        "or the front build hundreds of MB (TorchServe's max_response_size follows it)",
    )
    max_json_depth: int = Field(
        32,
        ge=2,
        description="deepest nesting a JSON request body may have (413 beyond)",
    )
    max_chunks_per_request: int = Field(
        64,
        ge=1,
        description="most chunks of the largest compiled length the texts of one request "
        "asking for chunking may make in all (413 beyond): what bounds the device time one "
        "request of long texts can take",
    )


# what to run instead, for each server neuronserve once started itself
_RUN_INSTEAD = {
    "triton": "neuronserve package triton ARTIFACT --repository REPO, then tritonserver "
    "--model-repository REPO",
    "torchserve": "neuronserve package torchserve ARTIFACT --model-store STORE, then "
    "torchserve --start --model-store STORE --ts-config STORE/config.properties",
}


def served_elsewhere(engine: str | None) -> str | None:
    """Why a spec, flag or variable asking for `engine` is refused (None: it asks for
    neuronserve's own workers, or for nothing)."""
    if engine in (None, "", "native", "neuronserve"):
        return None
    instead = _RUN_INSTEAD.get(str(engine))
    if instead is None:
        return f"engine {engine!r}: neuronserve serves on its own workers only"
    return f"neuronserve serves on its own workers only; to serve with {engine}, run: {instead}"


class FrontSection(Section):
    """neuronserve's HTTP front (`serve front`, the SageMaker and Kubernetes entrypoint):
    the public door to the workers, which listen on sockets in a private folder only."""

    key = "front"

    engine: str | None = Field(
        None,
        description="kept to refuse: neuronserve serves on its own workers only. For Triton "
        "or TorchServe, package for them (`neuronserve package triton|torchserve`) and "
        "start their own server on what it writes",
        json_schema_extra=flags(env="NEURONSERVE_ENGINE", hidden=True),
    )
    address: str = Field(
        "127.0.0.1",
        description="address the front listens on; any other than loopback turns API keys on "
        "(auth: auto)",
        json_schema_extra=flags(flat="front_address", env="NEURONSERVE_BIND"),
    )
    port: int = Field(
        3000,
        gt=0,
        lt=65536,
        description="port of the front (text-embeddings-inference's)",
        json_schema_extra=flags(flat="front_port", env="SAGEMAKER_BIND_TO_PORT"),
    )
    run_dir: Path = Field(
        Path(".neuronserve/front"),
        description="where the front keeps its pid file, log, generated API key and its "
        "workers' sockets",
        json_schema_extra=flags(flat="front_run_dir"),
    )
    default_model: str | None = Field(
        None,
        description="the model the root answers for when a request names none and several "
        "could (POST /, /tokenize, /decode, /info; text-embeddings-inference serves one "
        "model per URL, and its clients post to the root): default, the first served. "
        "Each model also has a base URL of its own, /models/<name>",
    )
    auth: Literal["auto", "on", "off"] = Field(
        "auto",
        description="API keys on the front: auto (on unless it listens on loopback only, or "
        "keys were given) | on | off",
    )
    api_key_file: Path | None = Field(
        None,
        description="file of API keys the front accepts, one per line (NEURONSERVE_API_KEY "
        "adds one); with none given, a key is generated into <front run_dir>/api_key",
    )
    metrics_auth: bool = Field(
        True,
        description="whether GET /metrics needs an API key when keys are on (off lets "
        "Prometheus scrape by annotation)",
        json_schema_extra=flags(env="NEURONSERVE_METRICS_AUTH"),
    )
    tls_cert: Path | None = Field(None, description="TLS certificate (PEM) for the front")
    tls_key: Path | None = Field(None, description="TLS private key (PEM) for the front")
    split_client_batches: bool = Field(
        False,
        description="accept a request over max_client_batch instead of answering 413 (it "
        "goes to the workers in pieces of the model's largest compiled batch, as every "
        "request does)",
        json_schema_extra=flags("--split-client-batches/--no-split"),
    )
    max_in_flight: int = Field(
        512,
        ge=1,
        description="requests the front works on at once; beyond it, 429 with Retry-After "
        "instead of an unbounded queue",
        json_schema_extra=flags(env="NEURONSERVE_MAX_IN_FLIGHT"),
    )
    deadline_s: float = Field(
        60,
        gt=0,
        description="longest a request may take through the front (504 beyond)",
        json_schema_extra=flags(env="SAGEMAKER_MODEL_SERVER_TIMEOUT"),
    )
    header_timeout_s: float = Field(
        10,
        gt=0,
        description="longest a client may take to send a request's headers once it has "
        "begun; the connection is closed beyond (a client that never finishes its headers "
        "would otherwise hold a connection forever)",
    )
    max_connections: int = Field(
        2048,
        ge=16,
        description="client connections (and requests) the front holds at once; beyond it "
        "new requests get 503, so file descriptors are left for probes and the workers",
    )
    keep_alive_s: float = Field(
        75,
        ge=10,
        description="how long the front keeps an idle client connection open; above the "
        "5 s it asks clients to wait in Retry-After and above the 60 s idle timeout of "
        "ALB and ingress-nginx, so the client, not the front, closes an idle connection "
        "(the other way round a request sent as the front closes is lost)",
    )

    otlp_endpoint: str | None = Field(
        None,
        description="export a trace of every request over OpenTelemetry's OTLP to this "
        "collector (as text-embeddings-inference's --otlp-endpoint; e.g. "
        "http://localhost:4317, or the collector's /v1/traces URL with otlp_protocol "
        "http/protobuf): the front's stages, the call to the workers, and the worker's "
        "queue, tokenizing and each device call. Default: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else no "
        "traces. Needs neuronserve[otel]",
    )
    otlp_protocol: Literal["grpc", "http/protobuf"] | None = Field(
        None,
        description="OTLP's transport to otlp_endpoint: grpc | http/protobuf (default: "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    otlp_service_name: str | None = Field(
        None,
        description="the service.name the traces carry (default: OTEL_SERVICE_NAME, else "
        "neuronserve)",
    )

    @field_validator("engine")
    @classmethod
    def _own_workers_only(cls, v: str | None) -> str | None:
        refusal = served_elsewhere(v)
        if refusal:
            raise ValueError(refusal)
        return None

    @model_validator(mode="after")
    def _tls_needs_both_files(self) -> FrontSection:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")
        return self


class MultiModelSection(Section):
    """SageMaker's multi-model contract: models loaded, listed, swapped and unloaded at
    run time through /models."""

    key = "multi_model"

    enabled: bool = Field(
        False,
        description="serve SageMaker's multi-model contract: models are loaded, listed, "
        "swapped and unloaded at run time through /models (behind the admin key outside "
        "SageMaker), loaded on first use and the least recently used idle one evicted "
        "when a worker's memory budget is spent",
        json_schema_extra=flags(
            "--multi-model/--fixed-models", flat="multi_model", env="SAGEMAKER_MULTI_MODEL"
        ),
    )
    target: Target = Field(
        "cpu",
        description="the target the endpoint's models are compiled for, when it starts with none",
        json_schema_extra=flags("--multi-model-target", flat="target", env="NEURONSERVE_TARGET"),
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="memory each worker may fill with models, in MiB (device "
        "memory per NeuronCore, host memory per worker on CPU); unset: what the host has",
        json_schema_extra=flags(env="NEURONSERVE_MEMORY_BUDGET_MB"),
    )
    idle_unload_s: float | None = Field(
        None,
        gt=0,
        description="unload a model after this many seconds without a request "
        "(it loads again on its next one); unset: models stay until memory is needed",
    )
    admin_key_file: Path | None = Field(
        None,
        description="outside SageMaker: file of keys for the model management "
        "routes (/models), one per line (NEURONSERVE_ADMIN_KEY adds one); with none given, "
        "a key is generated into <front run_dir>/admin_key",
    )
    catalog_dir: Path | None = Field(
        None,
        description="the folder through which the front tells the workers which models to "
        "hold (the front sets it)",
        json_schema_extra=flags(cli=False),
    )


class ModelEntry(BaseModel):
    """One model of a deployment that serves several (the spec's `models` list)."""

    model_config = ConfigDict(extra="forbid")

    artifact: Path = Field(description="artifact directory (compile output)")
    name: str | None = Field(
        None, description="name the model is addressed by (default: the artifact's)"
    )
    truncation: bool | None = Field(
        None,
        description="this model's answer to over-long text (default: the deployment's "
        "`truncation`, else what the artifact recorded)",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        return None if v is None else safe_name(v)

    def served_name(self, recorded: str) -> str:
        """The name the model is served under: the one given here, else the one its
        artifact recorded (`recorded`, its manifest's); the one place that decides it."""
        return recorded if self.name is None else self.name


class ModelSource(BaseModel):
    """A model of a deployment named by Hugging Face Hub id or folder: `serve front`
    compiles it with the spec's compile section (for this host's target unless the section
    names one) into the artifact cache, and serves what it compiled."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="a Hugging Face Hub id (org/name, org/name@revision) or a model folder"
    )

    @field_validator("model", mode="before")
    @classmethod
    def _folder_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, Path) else v

    revision: str | None = Field(None, description="the Hub revision; default: main")
    task: Task | None = Field(
        None, description="its task (default: the spec's `task` if given, else its config's)"
    )
    name: str | None = Field(
        None, description="name the model is addressed by (default: the Hub name's last part)"
    )
    truncation: bool | None = Field(
        None, description="this model's answer to over-long text (default: the deployment's)"
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        return None if v is None else safe_name(v)


# What `neuronserve package triton|torchserve` writes for those servers' own starts: a
# Triton model repository and a TorchServe model store (packaging/).
class TritonSection(Section):
    """What `neuronserve package triton` writes: the model repository that
    `tritonserver --model-repository` serves. Its instances are the worker section's."""

    key = "triton"

    repository: Path = Field(
        Path("triton_repo"),
        description="the Triton model repository `package triton` writes",
        json_schema_extra=flags(flat="triton_repository"),
    )


class TorchServeSection(Section):
    """What `neuronserve package torchserve` writes: the model store `torchserve --start`
    serves, and what its config.properties tells TorchServe. Its workers are the worker
    section's."""

    key = "torchserve"

    bind_address: str = Field(
        "127.0.0.1",
        description="address TorchServe listens on (its config.properties' addresses)",
        json_schema_extra=flags(flat="bind_address"),
    )

    model_store: Path = Field(
        Path("model_store"),
        description="the TorchServe model store `package torchserve` writes",
    )
    served_from: Path | None = Field(
        None,
        description="the folder TorchServe will find the store in, when not where it is "
        "written (KServe mounts it at /mnt/models/model-store): the paths its "
        "config.properties names (default: where it is written)",
    )
    archive_format: Literal["default", "no-archive"] = Field(
        "default",
        description="default (.mar) or no-archive (a folder)",
    )
    token_auth: bool = Field(
        True,
        description="TorchServe token authorization",
        json_schema_extra=flags("--token-auth/--no-token-auth"),
    )
    token_expiration_min: int = Field(
        60,
        ge=1,
        description="minutes TorchServe's inference key lives (TorchServe's default 60)",
    )
    inference_port: int = Field(8080, gt=0, lt=65536, description="TorchServe inference port")
    management_port: int = Field(8081, gt=0, lt=65536, description="TorchServe management port")
    metrics_port: int = Field(8082, gt=0, lt=65536, description="TorchServe metrics port")
    # TorchServe always starts its gRPC endpoints too: two servers on one host need their own
    grpc_inference_port: int = Field(
        7070, gt=0, lt=65536, description="TorchServe gRPC inference port"
    )
    grpc_management_port: int = Field(
        7071,
        gt=0,
        lt=65536,
        description="TorchServe gRPC management port",
    )
    batch_requests: int | None = Field(
        None,
        ge=1,
        description="TorchServe batchSize: requests one worker takes at once "
        "(default: the largest batch the artifact's bucket times say is worth forming)",
    )
    worker_retry_timeout_s: int = Field(
        60,
        ge=1,
        description="TorchServe /ping turns Unhealthy once a worker has failed to "
        "start for this long (maxRetryTimeoutInSec)",
    )


# the sections every spec has, by key, in the order the reference lists them
SECTIONS: tuple[type[Section], ...] = (
    CompileSection,
    AccuracySection,
    WorkerSection,
    LimitsSection,
    FrontSection,
    MultiModelSection,
    TritonSection,
    TorchServeSection,
)


class DeploySpec(BaseModel):
    """The deployment (its models, their name, their answer to over-long text) and a
    section per consumer."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str | None = Field(
        None,
        description="model name on the servers (default: the artifact's, i.e. its directory name)",
    )
    artifact: Path | None = Field(
        None,
        description="artifact directory (compile output)",
        json_schema_extra=flags("--out"),
    )
    models: list[ModelEntry | ModelSource] = Field(
        default_factory=list,
        description="several models served together, one worker per core group holding "
        "them all (instead of `artifact`): each entry an `artifact` (compile output), or a "
        "`model` (a Hub id or folder, compiled at start into the artifact cache, with an "
        "optional `revision` and `task`), with an optional `name` and `truncation`",
        json_schema_extra=flags(cli=False),
    )
    deployment_name: str = Field(
        "models",
        description="with several models: the name they are packaged under together "
        "(TorchServe's /predictions/<name>, Triton's model), each model addressed inside it "
        "by its own name; one model is served under its own name",
    )
    truncation: bool | None = Field(
        None,
        description="cut texts longer than the largest compiled sequence length, or refuse "
        "them with a 413. compile: on unless --no-truncation, recorded in the artifact; "
        "package: default what the artifact recorded",
        json_schema_extra=flags("--truncation/--no-truncation"),
    )
    compile: CompileSection = Field(default_factory=CompileSection)
    accuracy: AccuracySection = Field(default_factory=AccuracySection)
    worker: WorkerSection = Field(default_factory=WorkerSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    front: FrontSection = Field(default_factory=FrontSection)
    multi_model: MultiModelSection = Field(default_factory=MultiModelSection)
    triton: TritonSection = Field(default_factory=TritonSection)
    torchserve: TorchServeSection = Field(default_factory=TorchServeSection)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        return None if v is None else safe_name(v)

    @field_validator("deployment_name")
    @classmethod
    def _plain_deployment_name(cls, v: str) -> str:
        return safe_name(v, "deployment name")

    @model_validator(mode="after")
    def _artifact_or_models(self) -> DeploySpec:
        if self.models and self.artifact is not None:
            raise ValueError("give either `artifact` (one model) or `models` (several), not both")
        if self.models and self.name is not None:
            raise ValueError(
                "`name` names the one model of a deployment; with `models` each entry has "
                "its own `name`, and `deployment_name` names the set"
            )
        return self

    def model_sources(self) -> list[ModelSource]:
        """The models this spec names by Hub id or folder, still to be compiled: its
        `models` entries that give a `model`, or, when it names no artifact, the compile
        section's `model` (with the spec's `name` and `truncation`)."""
        given = [m for m in self.models if isinstance(m, ModelSource)]
        if given or self.models or self.artifact is not None or self.compile.model is None:
            return given
        return [
            ModelSource(
                model=self.compile.model,
                revision=self.compile.revision,
                name=self.name,
                truncation=self.truncation,
            )
        ]

    def model_entries(self) -> list[ModelEntry]:
        """The models this spec deploys: its `models`, or the one `artifact` (with `name`
        and `truncation`); empty when it names none. SpecError while some are named by
        Hub id or folder (compile.cache.resolved compiles those first)."""
        if any(isinstance(m, ModelSource) for m in self.models):
            raise SpecError(
                "the spec names models by Hub id or folder (`model`): `serve front` compiles "
                "them; other commands need artifacts (`neuronserve compile --model ... --out "
                "DIR`)"
            )
        if self.models:
            return [m for m in self.models if isinstance(m, ModelEntry)]
        if self.artifact is None:
            return []
        return [ModelEntry(artifact=self.artifact, name=self.name, truncation=self.truncation)]

    def model_name(self) -> str:
        if self.name:
            return self.name
        if self.artifact:
            folder = Path(self.artifact).resolve().name
            try:
                return safe_name(folder, "the artifact folder's name")
            except ValueError as e:
                raise SpecError(f"{e}; or set `name`") from None
        raise SpecError("no model name: set `name` in the spec or pass --name")

    def given(self, section: str) -> dict[str, Any]:
        """The fields of section `section` given explicitly."""
        return dict(getattr(self, section).model_dump(exclude_unset=True))

    def with_models(self, models: list[ModelEntry] | list[ModelSource]) -> DeploySpec:
        """A copy deploying `models` in place of its own (its `artifact`, `name` and
        `models`): one artifact becomes the spec's `artifact`, with its name and
        truncation when it gives them; anything else its `models`."""
        data = self.model_dump(exclude_unset=True, exclude={"artifact", "name", "models"})
        one = models[0] if len(models) == 1 else None
        if isinstance(one, ModelEntry):
            data["artifact"] = one.artifact
            if one.name is not None:
                data["name"] = one.name
            if one.truncation is not None:
                data["truncation"] = one.truncation
        else:
            data["models"] = [m.model_dump(exclude_none=True) for m in models]
        return DeploySpec.model_validate(data)

    def with_section(self, section: str, **fields: Any) -> DeploySpec:
        """A copy with `fields` set in section `section`."""
        data = self.model_dump(exclude_unset=True)
        data[section] = {**data.get(section, {}), **fields}
        return DeploySpec.model_validate(data)


# The flat layout: every field at the top level. The deployment's own fields kept their
# names; every other field moved to the section that declares it (its name there, or the
# `flat` name it declares).
TOP_FIELDS = ("name", "artifact", "models", "deployment_name", "truncation")


def _declared() -> Iterator[tuple[str, type[Section], str, dict[str, Any]]]:
    """Every section's fields: (its key, its model, the field, what `flags` declared)."""
    for section in SECTIONS:
        key = section.key
        for field, info in section.model_fields.items():
            yield key, section, field, declared(info)


def flat_names() -> dict[str, list[tuple[str, str]]]:
    """Each flat-layout field -> the (section, field) pairs it now is."""
    out: dict[str, list[tuple[str, str]]] = {}
    for key, _, field, extra in _declared():
        names = extra.get("flat")
        names = names if isinstance(names, list) else [field]
        for name in names:
            out.setdefault(str(name), []).append((key, field))
    return out


def environment_variables() -> dict[str, list[tuple[str, str]]]:
    """Each environment variable the serving container reads into the spec -> the
    (section, field) pairs it sets (declared on the fields: `flags(env=...)`)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for key, _, field, extra in _declared():
        if extra.get("env"):
            out.setdefault(str(extra["env"]), []).append((key, field))
    return out


def env_of(key: str, field: str) -> str:
    """The environment variable that sets section `key`'s `field` in the container."""
    for var, fields in environment_variables().items():
        if (key, field) in fields:
            return var
    raise KeyError(f"{key}.{field} is set by no environment variable")


def from_environment(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The section fields `environ` sets (its variables declared on the fields; an empty
    one is unset), each value checked as its field reads it: one it refuses is a
    SpecError naming the variable. A `largest` variable (a grid axis) gives the default
    buckets below it, then it (`CompileSection.up_to`)."""
    out: dict[str, dict[str, Any]] = {}
    for key, section, field, extra in _declared():
        var = extra.get("env")
        given = environ.get(var, "").strip() if var else ""
        if not given:
            continue
        value: Any = given
        if extra.get("env_reads") == "largest":
            if not given.isdigit() or int(given) < 1:
                raise SpecError(f"{var}={given!r}: a positive whole number")
            value = CompileSection.up_to(field, int(given))
        try:
            checked = section.model_validate({field: value})
        except ValidationError as e:
            raise SpecError(f"{var}={given!r}: {e.errors()[0]['msg']}") from None
        out.setdefault(key, {})[field] = getattr(checked, field)
    return out


def sectioned(data: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """`data` in the section layout, and a note per flat field moved (empty when `data`
    is already sectioned). A field unknown in both layouts stays, for the error."""
    section_keys = {s.key for s in SECTIONS}
    flat = flat_names()
    out: dict[str, Any] = {}
    moved: list[str] = []
    for key, value in data.items():
        if key in TOP_FIELDS or (key in section_keys and isinstance(value, dict)):
            # a section given twice (flat fields before it) merges, the section winning
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                value = {**out[key], **value}
            out[key] = value
        elif key in flat:
            for section, field in flat[key]:
                part = out.setdefault(section, {})
                if isinstance(part, dict):
                    part.setdefault(field, value)
            moved.append(f"{key} -> " + ", ".join(f"{s}.{f}" for s, f in flat[key]))
        else:
            out[key] = value
    return out, moved


def load_spec(path: Path | None = None, overrides: dict[str, Any] | None = None) -> DeploySpec:
    """Read `path` (YAML) if given, apply `overrides` (sections of fields; None values are
    not given), validate the result. A file or overrides in the flat layout load, with a
    note (stderr for a file, a DeprecationWarning otherwise) of where each field went."""
    data = _read_file(path) if path is not None else {}
    given, moved = sectioned(_without_none(overrides or {}), "overrides")
    if moved:
        warnings.warn(f"flat spec fields are deprecated: {'; '.join(moved)}", DeprecationWarning, 2)
    if given.keys() & {"artifact", "models"}:
        # artifacts given on the command line replace the file's, one or several
        data.pop("artifact", None)
        data.pop("models", None)
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    try:
        return DeploySpec(**data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = (
                ".".join(str(p) for p in err["loc"] if not str(p).startswith("function")) or "spec"
            )
            lines.append(f"  {loc}: {err['msg']} (got {err.get('input')!r})")
        src = f" in {path}" if path else ""
        raise SpecError(f"invalid deployment spec{src}:\n" + "\n".join(lines)) from None


def _read_file(path: Path) -> dict[str, Any]:
    """A spec file's fields in the section layout, its relative paths made absolute."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as e:
        raise SpecError(f"spec file {path} does not exist") from e
    except yaml.YAMLError as e:
        raise SpecError(f"spec file {path} is not valid YAML: {e}") from e
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise SpecError(f"spec file {path} must hold a mapping of fields, not {type(loaded)}")
    loaded = {k.replace("-", "_"): v for k, v in loaded.items()}
    data, moved = sectioned(loaded, str(path))
    if moved:
        print(
            f"note: {path} uses the flat layout, which is deprecated: each field now "
            f"lives in a section ({'; '.join(moved)})",
            file=sys.stderr,
        )
    _relative_to(data, Path(path).resolve().parent)
    return data


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict) and not isinstance(v, ModelEntry):
            inner = _without_none(v)
            if inner or k in TOP_FIELDS:
                out[k] = inner
        elif v is not None:
            out[k] = v
    return out


def _is_path(annotation: Any) -> bool:
    return annotation is Path or Path in get_args(annotation)


def _relative_to(data: dict[str, Any], base: Path) -> None:
    """Relative paths in a spec file are relative to the file, as users expect."""
    parts: dict[str, type[BaseModel]] = {s.key: s for s in SECTIONS}
    for key in ("artifact",):
        if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
            data[key] = str(base / data[key])
    for key, section in parts.items():
        values = data.get(key)
        if not isinstance(values, dict):
            continue
        for field, info in section.model_fields.items():
            v = values.get(field)
            if _is_path(info.annotation) and isinstance(v, str) and not Path(v).is_absolute():
                values[field] = str(base / v)
    for entry in data.get("models") or []:
        where = entry.get("artifact") if isinstance(entry, dict) else None
        if isinstance(where, str) and not Path(where).is_absolute():
            entry["artifact"] = str(base / where)
    _model_refs_relative_to(data, base)


def _model_refs_relative_to(data: dict[str, Any], base: Path) -> None:
    for holder in [data.get("compile"), *(data.get("models") or [])]:
        if isinstance(holder, dict) and isinstance(holder.get("model"), str):
            holder["model"] = _model_ref(holder["model"], base)


def _model_ref(ref: str, base: Path) -> str:
    """A model named in a spec file: a Hub id (org/name) as it is, even where a folder of
    that name lies beside the file (names.is_hub_id); a folder relative to the file."""
    if is_hub_id(ref) or Path(ref).is_absolute() or ref.startswith("~"):
        return ref
    return str(base / ref)
