"""One validated deployment spec shared by `compile`, `package` and `serve`.

A spec comes from a YAML file, from command-line flags, or both; flags override the
file field by field. Every field has one meaning everywhere, so the same file drives
all three commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .names import safe_name

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

# marks a field that shapes an engine's workers (how many, their batches, queues and
# limits): it travels with the deployment to the engine behind the front, the SageMaker
# container and the Kubernetes pod. The rest (ports, folders, the front's own settings)
# belongs to where it is given.
REACHES_WORKERS: dict[str, Any] = {"reaches_workers": True}


class SpecError(ValueError):
    """A spec file or flag has a value neuronserve cannot use."""


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


class DeploySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what to compile
    model: Path | None = Field(
        None,
        description="local Hugging Face model directory (config.json, weights, a fast tokenizer)",
    )
    name: str | None = Field(
        None,
        description="model name on the servers (default: the artifact's, i.e. its directory name)",
    )
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
    )
    target: Target = Field("cpu", description="cpu | neuronx (Inf2/Trn1) | neuron (Inf1)")
    batch_sizes: list[int] = Field(
        default_factory=lambda: [1, 4, 8], description="compiled batch sizes, e.g. 1,4,8"
    )
    sequence_lengths: list[int] = Field(
        default_factory=lambda: [16, 32, 64, 128],
        description="compiled sequence lengths in tokens, e.g. 16,32,64,128",
    )
    pooling: Pooling = Field(
        "auto",
        description="feature-extraction pooling: auto "
        "(sentence-transformers config, else cls), "
        "mean, cls, or splade (sparse term weights of a masked-LM model, for /embed_sparse: "
        "the sparse-embedding task; auto picks it for a SparseEncoder)",
    )
    normalize: bool | None = Field(
        None, description="L2-normalise embeddings (default: the sentence-transformers config)"
    )
    token_embeddings: bool = Field(
        False,
        description="feature-extraction: compile every token's vector as well as the pooled "
        "one, for /embed_all (each call then also moves tokens x hidden floats per text off "
        "the device)",
    )
    truncation: bool | None = Field(
        None,
        description="cut texts longer than the largest compiled sequence length, or refuse "
        "them with a 413. compile: on unless --no-truncation, recorded in the artifact; "
        "package: default what the artifact recorded",
        json_schema_extra=REACHES_WORKERS,
    )
    tolerance: float = Field(
        1e-3, gt=0, description="largest accepted |compiled - eager| per bucket at fp32"
    )
    artifact: Path | None = Field(None, description="artifact directory (compile output)")
    models: list[ModelEntry] = Field(
        default_factory=list,
        description="several artifacts served together, one worker per core group holding "
        "them all (instead of `artifact`): each entry an `artifact` with an optional `name` "
        "and `truncation`",
    )
    deployment_name: str = Field(
        "models",
        description="with several models: the name the engine serves them under "
        "(TorchServe's /predictions/<name>, Triton's model), each model addressed inside it "
        "by its own name; one model is served under its own name",
    )
    multi_model: bool = Field(
        False,
        description="serve SageMaker's multi-model contract: models are loaded, listed, "
        "swapped and unloaded at run time through /models (behind the admin key outside "
        "SageMaker), loaded on first use and the least recently used idle one evicted "
        "when a worker's memory budget is spent (SAGEMAKER_MULTI_MODEL=true in the "
        "container)",
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="multi-model: memory each worker may fill with models, in MiB (device "
        "memory per NeuronCore, host memory per worker on CPU); unset: what the host has "
        "(NEURONSERVE_MEMORY_BUDGET_MB in the container)",
    )
    idle_unload_s: float | None = Field(
        None,
        gt=0,
        description="multi-model: unload a model after this many seconds without a request "
        "(it loads again on its next one); unset: models stay until memory is needed",
    )
    catalog_dir: Path | None = Field(
        None,
        description="multi-model: the folder through which the front tells the workers "
        "which models to hold (the front sets it)",
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
        default_factory=list, description="extra compiler argument (repeat for several)"
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
    neuron_cores: int | None = Field(
        None,
        ge=1,
        description="NeuronCores of the serving host (default: discovered where workers start)",
        json_schema_extra=REACHES_WORKERS,
    )

    # how to serve it
    layout: Layout = Field(
        "throughput",
        description="throughput: one single-core worker per core (default); "
        "latency: one worker using every core (workers and "
        "cores_per_worker refine throughput)",
        json_schema_extra=REACHES_WORKERS,
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="workers (TorchServe) or model instances (Triton); default: one per core group",
        json_schema_extra=REACHES_WORKERS,
    )
    cores_per_worker: int = Field(
        1,
        ge=1,
        description="cores leased by each worker or instance",
        json_schema_extra=REACHES_WORKERS,
    )
    max_batch_delay_ms: int = Field(
        0,
        ge=0,
        description="longest the engine holds a request to fill a batch (ms). 0 (default): "
        "never wait; a batch is whatever queued while the workers were busy, so a lone "
        "request runs at once and a loaded server still batches (TorchServe's least is "
        "1 ms: it reads 0 as its 100 ms default)",
        json_schema_extra=REACHES_WORKERS,
    )
    batch_requests: int | None = Field(
        None,
        ge=1,
        description="TorchServe batchSize: requests one worker takes at once "
        "(default: the largest batch the artifact's bucket times say is worth forming)",
        json_schema_extra=REACHES_WORKERS,
    )
    response_timeout_s: int = Field(
        120,
        ge=1,
        description="seconds a request may take before the engine gives up on it",
        json_schema_extra=REACHES_WORKERS,
    )
    max_queued: int = Field(
        100,
        ge=1,
        description="requests that may wait for a worker (TorchServe's job queue, Triton's "
        "dynamic-batching queue); beyond it the engine refuses at once (503) instead of "
        "letting latency grow without bound",
        json_schema_extra=REACHES_WORKERS,
    )
    queue_timeout_ms: int | None = Field(
        None,
        ge=1,
        description="longest a request may wait in the engine's queue before it is refused "
        "(503); default: no limit but response_timeout_s",
        json_schema_extra=REACHES_WORKERS,
    )
    worker_retry_timeout_s: int = Field(
        60,
        ge=1,
        description="TorchServe /ping turns Unhealthy once a worker has failed to "
        "start for this long (maxRetryTimeoutInSec)",
        json_schema_extra=REACHES_WORKERS,
    )
    model_store: Path = Field(Path("model_store"), description="TorchServe model store")
    archive_format: Literal["default", "no-archive"] = Field(
        "default", description="default (.mar) or no-archive (a folder)"
    )
    token_auth: bool = Field(True, description="TorchServe token authorization")
    triton_inference_key: bool = Field(
        False,
        description="Triton's inference API behind its admin key too (the front, which "
        "holds the key, starts it so; `serve triton` alone leaves inference open, as "
        "tritonclient users expect)",
    )
    token_expiration_min: int = Field(
        60,
        ge=1,
        description="minutes TorchServe's inference key lives (TorchServe's default 60; the "
        "front, which holds the key, starts it with ten years)",
    )
    bind_address: str = Field("127.0.0.1", description="address the engines listen on")
    inference_port: int = Field(8080, gt=0, lt=65536, description="TorchServe inference port")
    management_port: int = Field(8081, gt=0, lt=65536, description="TorchServe management port")
    metrics_port: int = Field(8082, gt=0, lt=65536, description="TorchServe metrics port")
    # TorchServe always starts its gRPC endpoints too: two servers on one host need their own
    grpc_inference_port: int = Field(
        7070, gt=0, lt=65536, description="TorchServe gRPC inference port"
    )
    grpc_management_port: int = Field(
        7071, gt=0, lt=65536, description="TorchServe gRPC management port"
    )
    run_dir: Path = Field(
        Path(".neuronserve/torchserve"),
        description="where TorchServe keeps its pid file, keys, logs and temp files",
    )

    # Triton (instances = `workers`, cores per instance = `cores_per_worker`)
    triton_repository: Path = Field(Path("triton_repo"), description="Triton model repository")
    triton_run_dir: Path = Field(
        Path(".neuronserve/triton"), description="where tritonserver's pid file and log are kept"
    )
    http_port: int = Field(8000, gt=0, lt=65536, description="Triton HTTP port")
    grpc_port: int = Field(8001, gt=0, lt=65536, description="Triton gRPC port")
    triton_metrics_port: int = Field(8002, gt=0, lt=65536, description="Triton metrics port")
    sagemaker: bool = Field(
        False,
        description="refused: Triton's own SageMaker listener binds 0.0.0.0 without "
        "authentication; `serve front --engine triton` answers /ping and /invocations",
    )

    # the front (`serve front` and the SageMaker entrypoint): the public door to an engine
    # that listens on loopback only
    engine: Literal["torchserve", "triton"] = Field(
        "torchserve", description="the engine the front starts behind it: torchserve | triton"
    )
    front_address: str = Field(
        "127.0.0.1",
        description="address the front listens on; any other than loopback turns API keys on "
        "(auth: auto)",
    )
    front_port: int = Field(
        3000, gt=0, lt=65536, description="port of the front (text-embeddings-inference's)"
    )
    front_run_dir: Path = Field(
        Path(".neuronserve/front"),
        description="where the front keeps its pid file, log, generated API key and the engine "
        "it starts",
    )
    auth: Literal["auto", "on", "off"] = Field(
        "auto",
        description="API keys on the front: auto (on unless it listens on loopback only, or "
        "keys were given) | on | off",
    )
    api_key_file: Path | None = Field(
        None,
        description="file of API keys the front accepts, one per line (NEURONSERVE_API_KEY "
        "adds one); with none given, a key is generated into <front_run_dir>/api_key",
    )
    admin_key_file: Path | None = Field(
        None,
        description="multi-model outside SageMaker: file of keys for the model management "
        "routes (/models), one per line (NEURONSERVE_ADMIN_KEY adds one); with none given, "
        "a key is generated into <front_run_dir>/admin_key",
    )
    metrics_auth: bool = Field(
        True,
        description="whether GET /metrics needs an API key when keys are on (off lets "
        "Prometheus scrape by annotation)",
    )
    tls_cert: Path | None = Field(None, description="TLS certificate (PEM) for the front")
    tls_key: Path | None = Field(None, description="TLS private key (PEM) for the front")
    max_body_bytes: int = Field(
        2_000_000,
        ge=1,
        description="largest request body the front and TorchServe read (413 beyond)",
        json_schema_extra=REACHES_WORKERS,
    )
    max_client_batch: int = Field(
        1024,
        ge=1,
        description="most inputs one request may hold (413 beyond)",
        json_schema_extra=REACHES_WORKERS,
    )
    max_text_chars: int = Field(
        100_000,
        ge=1,
        description="most characters one text (or one side of a pair) may hold, checked "
        "before tokenizing (413 beyond)",
        json_schema_extra=REACHES_WORKERS,
    )
    max_answer_bytes: int = Field(
        64 * 2**20,
        ge=2**20,
        description="largest answer one request may get, as JSON: every token's vector "
        "(/embed_all), a SPLADE model's whole vectors; refused (413) before the model runs "
        "when its tokens say it would be larger, so one cheap request cannot make a worker "
        "or the front build hundreds of MB (TorchServe's max_response_size follows it)",
        json_schema_extra=REACHES_WORKERS,
    )
    max_json_depth: int = Field(
        32,
        ge=2,
        description="deepest nesting a JSON request body may have (413 beyond)",
        json_schema_extra=REACHES_WORKERS,
    )
    split_client_batches: bool = Field(
        False,
        description="accept a request over max_client_batch and send it to the engine in "
        "pieces of that size, instead of answering 413",
    )
    max_in_flight: int = Field(
        512,
        ge=1,
        description="requests the front works on at once; beyond it, 429 with Retry-After "
        "instead of an unbounded queue",
    )
    deadline_s: float = Field(
        60, gt=0, description="longest a request may take through the front (504 beyond)"
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
        "new requests get 503, so file descriptors are left for probes and the engine",
    )
    keep_alive_s: float = Field(
        75,
        ge=10,
        description="how long the front keeps an idle client connection open; above the "
        "5 s it asks clients to wait in Retry-After and above the 60 s idle timeout of "
        "ALB and ingress-nginx, so the client, not the front, closes an idle connection "
        "(the other way round a request sent as the front closes is lost)",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        return None if v is None else safe_name(v)

    @field_validator("deployment_name")
    @classmethod
    def _plain_deployment_name(cls, v: str) -> str:
        return safe_name(v, "deployment name")

    @model_validator(mode="after")
    def _artifact_or_models(self):
        if self.models and self.artifact is not None:
            raise ValueError("give either `artifact` (one model) or `models` (several), not both")
        if self.models and self.name is not None:
            raise ValueError(
                "`name` names the one model of a deployment; with `models` each entry has "
                "its own `name`, and `deployment_name` names the set"
            )
        return self

    def model_entries(self) -> list[ModelEntry]:
        """The models this spec deploys: its `models`, or the one `artifact` (with `name`
        and `truncation`); empty when it names none."""
        if self.models:
            return list(self.models)
        if self.artifact is None:
            return []
        return [ModelEntry(artifact=self.artifact, name=self.name, truncation=self.truncation)]

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
    def _neuron_options_need_neuron_target(self):
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

    @model_validator(mode="after")
    def _tls_needs_both_files(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")
        return self

    @model_validator(mode="after")
    def _latency_layout_is_one_worker(self):
        if self.layout == "latency" and ((self.workers or 1) != 1 or self.cores_per_worker != 1):
            raise ValueError(
                "layout latency runs one worker on every core: leave workers and "
                "cores_per_worker unset, or use layout throughput"
            )
        return self

    @classmethod
    def worker_fields(cls) -> tuple[str, ...]:
        """The fields marked REACHES_WORKERS."""
        return tuple(
            name
            for name, f in cls.model_fields.items()
            if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("reaches_workers")
        )

    def compiler_options(self) -> dict:
        return {
            "auto_cast": self.auto_cast,
            "auto_cast_type": self.auto_cast_type,
            "optlevel": self.optlevel,
            "compiler_args": list(self.compiler_args),
            "pipeline_cores": self.pipeline_cores,
            "compiler_workdir": self.compiler_workdir,
            "compile_for": self.compile_for,
            # the host's NeuronCores, when known, cap Inf1's pipeline_cores: auto
            "neuron_cores": self.neuron_cores,
        }

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


def load_spec(path: Path | None = None, overrides: dict[str, Any] | None = None) -> DeploySpec:
    """Read `path` (YAML) if given, apply non-None `overrides`, validate the result."""
    data: dict[str, Any] = {}
    if path is not None:
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
        data.update({k.replace("-", "_"): v for k, v in loaded.items()})
        _relative_to(data, Path(path).resolve().parent)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "artifact" in given or "models" in given:
        # artifacts given on the command line replace the file's, one or several
        data.pop("artifact", None)
        data.pop("models", None)
    data.update(given)
    try:
        return DeploySpec(**data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "spec"
            lines.append(f"  {loc}: {err['msg']} (got {err.get('input')!r})")
        src = f" in {path}" if path else ""
        raise SpecError(f"invalid deployment spec{src}:\n" + "\n".join(lines)) from None


def _relative_to(data: dict[str, Any], base: Path) -> None:
    """Relative paths in a spec file are relative to the file, as users expect."""
    for key in (
        "model",
        "artifact",
        "model_store",
        "run_dir",
        "triton_repository",
        "triton_run_dir",
        "compiler_workdir",
        "front_run_dir",
        "api_key_file",
        "admin_key_file",
        "tls_cert",
        "tls_key",
    ):
        if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
            data[key] = str(base / data[key])
    for entry in data.get("models") or []:
        where = entry.get("artifact") if isinstance(entry, dict) else None
        if isinstance(where, str) and not Path(where).is_absolute():
            entry["artifact"] = str(base / where)
