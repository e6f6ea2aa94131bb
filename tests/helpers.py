"""What many tests share: varied texts, independent references computed with plain
transformers (for the unit tests that check the Runner), and small process helpers
(free ports, polling with a deadline, running the CLI)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import torch

from neuronserve.processes import free_ports

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "neuron_standin"

# Varied sentences for numerical checks: 1 to ~200 words, unicode, near-empty.
SENTENCES = [
    "hello",
    "",
    "   ",
    "?",
    "The cat sat on the mat.",
    "Ünïcödé façade — naïve café, 東京タワー and emoji 🚀🔥 mixed in.",
    "Ein schöner Tag am Meer, mit Möwen und Sonnenschein über den Dünen.",
    "How do I reset my password if the confirmation email never arrives?",
    " ".join(["data"] * 50),
    " ".join(f"word{i % 17} and more" for i in range(40)),
    " ".join(["alpha beta gamma delta"] * 50),  # 200 words
]
LABELS = ["negative", "neutral", "positive"]  # the tiny classifier's
# A question-answering context of about 50 tokens: several windows of the tests' 32-token
# bucket, with accents, an emoji and a name of two words
QA_CONTEXT = (
    "Ana met Bob in Paris last week. They took a train to Zürich, walked by the lake 🎉 "
    "and had dinner at a small café near the station before Bob flew home to São Paulo."
)


def reference_embeddings(model_dir: Path, texts: list[str], normalize: bool = True) -> np.ndarray:
    """all-MiniLM-L6-v2 as its model card defines it: eager transformers, mean pooling
    over the attention mask, L2 normalisation (unless not asked); one text at a time, no
    padding."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            emb = (hidden * mask).sum(1) / mask.sum(1)
            out.append(
                (torch.nn.functional.normalize(emb, dim=-1) if normalize else emb)[0].numpy()
            )
    return np.stack(out)


def eager_classifier_scores(model_dir: Path, texts) -> np.ndarray:
    """Softmax of the eager model's logits, one text (or pair) at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for t in texts:
            pair = t if isinstance(t, tuple) else (t,)
            enc = tok(*pair, return_tensors="pt")
            rows.append(torch.softmax(model(**enc).logits.double(), -1)[0].numpy())
    return np.stack(rows)


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def label_scores(result: list[dict]) -> list[float]:
    """A classification answer's scores in LABELS order."""
    scores = {x["label"]: x["score"] for x in result}
    return [scores[label] for label in LABELS]


def free_port() -> int:
    return free_ports(1)[0]


def ports_for(*fields: str) -> dict[str, int]:
    """A distinct free port for each spec field."""
    return dict(zip(fields, free_ports(len(fields)), strict=True))


def wait_for(condition, timeout: float = 60, interval: float = 0.25, what: str = "condition"):
    """Poll `condition` until it returns something truthy, or fail after `timeout`: first
    every 10 ms, then less often, up to every `interval` (a condition met at once costs
    no wait; a long wait costs few polls)."""
    deadline, pause = time.monotonic() + timeout, min(0.01, interval)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, interval)


@functools.cache
def as_nobody() -> list[str] | None:
    """The command prefix that runs a standard-library Python script as `nobody` (another
    local user, to try what they could), or None where this host cannot: not root, no
    runuser, or no Python that `nobody` may execute (this interpreter may live in a home
    only its owner can enter; the system's python3 then serves)."""
    import shutil

    if os.getuid() != 0 or shutil.which("runuser") is None:
        return None
    candidates = [os.path.realpath(sys.executable), shutil.which("python3", path="/usr/bin")]
    for python in filter(None, candidates):
        prefix = ["runuser", "-u", "nobody", "--", python]
        tried = subprocess.run([*prefix, "-c", "import json, socket"], capture_output=True)
        if tried.returncode == 0:
            return prefix
    return None


# why a test run as another local user skips where as_nobody() is None
NO_NOBODY = "trying as another local user needs root, runuser and a Python nobody may run"


def run_cli(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "neuronserve.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        timeout=900,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"neuronserve {' '.join(map(str, args))} failed "
            f"({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def package_for(server: str, spec) -> Path:
    """What `neuronserve package triton|torchserve` writes for `spec`, in this process:
    the deployment prepared as every packager prepares it, then the repository or store."""
    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import package_torchserve
    from neuronserve.packaging.triton import package_triton

    if server == "triton":
        return package_triton(spec.triton, prepare(spec, "instances"))
    assert server == "torchserve", server
    return package_torchserve(spec.torchserve, prepare(spec, "workers"))


def cli(
    *args: object, cwd: Path | None = None, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`neuronserve ARGS` run in this process (typer's test runner), answered as run_cli
    answers: for commands that finish by themselves and start no server, where a fresh
    interpreter (seconds of imports) would only cost time."""
    from typer.testing import CliRunner

    from neuronserve.cli import app

    before = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    done = subprocess.CompletedProcess(
        ["neuronserve", *map(str, args)], result.exit_code, result.stdout, result.stderr
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"neuronserve {' '.join(map(str, args))} failed ({done.returncode}):\n"
            f"{done.stdout}\n{done.stderr}"
        )
    return done


# the ports of what `package torchserve` writes into config.properties
PORT_FIELDS = (
    "inference_port",
    "management_port",
    "metrics_port",
    "grpc_inference_port",
    "grpc_management_port",
)


def write_spec(work: Path, **fields) -> dict:
    """deploy.yaml in `work` with free ports for every TorchServe endpoint, plus
    `fields`."""
    import yaml

    spec = {**ports_for(*PORT_FIELDS), **fields}
    spec = {k: str(v) if isinstance(v, Path) else v for k, v in spec.items()}
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec))
    return spec


class SageMakerServe:
    """The SageMaker `serve` entrypoint of a build context, run as a process the way the
    image runs it (PYTHONPATH = the context's copy of neuronserve), with `model_dir`
    standing in for /opt/ml/model."""

    def __init__(self, ctx: Path, model_dir: Path, tmp: Path, **env_extra: str):
        import subprocess

        port = free_port()
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ctx / "python"),
            "NEURONSERVE_PLATFORM": "sagemaker",
            "NEURONSERVE_MODEL_DIR": str(model_dir),
            "NEURONSERVE_CONFIG": str(ctx / "neuronserve.json"),
            "NEURONSERVE_BIND": "127.0.0.1",
            "NEURONSERVE_WORK_DIR": str(tmp / "work"),
            "SAGEMAKER_BIND_TO_PORT": str(port),
            **env_extra,
        }
        self.log = tmp / "serve.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [str(ctx / "serve")],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"

    def watch_until_ready(self) -> list[int | None]:
        """Every /ping answer until the first 200."""
        import requests

        seen: list[int | None] = []

        def ready():
            assert self.proc.poll() is None, "serve exited before it was ready:\n" + (
                self.log.read_text()
            )
            try:
                seen.append(requests.get(f"{self.url}/ping", timeout=5).status_code)
            except requests.RequestException:
                seen.append(None)
            return seen[-1] == 200

        wait_for(ready, timeout=300, interval=0.2, what="/ping to answer 200")
        return seen

    def stop(self) -> None:
        """SIGTERM, as SageMaker stops a container: it exits 0 with its engine gone."""
        import signal

        import psutil

        if self.proc.poll() is not None:
            return  # it exited by itself (watch_until_ready reports why)
        procs = [
            psutil.Process(self.proc.pid),
            *psutil.Process(self.proc.pid).children(recursive=True),
        ]
        self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(120)
        _, alive = psutil.wait_procs(procs, timeout=30)
        if status != 0 or alive:  # what it left must not hold cores for the next tests
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        assert status == 0, (status, self.log.read_text()[-3000:])
        assert not alive, alive


def sagemaker_context(work: Path, artifacts: list[Path], *extra: str) -> Path:
    """`neuronserve package sagemaker` of `artifacts` into work/context."""
    run_cli(
        "package", "sagemaker", *artifacts, "--target", "cpu", "--out", work / "context",
        *extra, cwd=work,
    )  # fmt: skip
    return work / "context"


def check_sagemaker_contract(url: str, runner, target: dict[str, str] | None = None) -> None:
    """/invocations through a running SageMaker front answers like the Runner in process:
    JSON over the largest compiled batch, plain text, a 400 for a bad request and a 413
    for over-long text. `target`: the X-Amzn-SageMaker-Target-Model header, when the
    endpoint serves several models."""
    import requests

    texts = SENTENCES[4:8] + ["x"] * 7  # more texts than the largest compiled batch
    want = runner.responses_for_bodies([({"inputs": texts}, None)])[0]
    target = target or {}
    r = requests.post(f"{url}/invocations", json={"inputs": texts}, headers=target, timeout=60)
    assert r.status_code == 200, r.text
    # a request over the largest batch is split, so rows may sit in other buckets
    assert np.allclose(r.json(), want, atol=1e-5)
    plain = requests.post(
        f"{url}/invocations",
        data=texts[0].encode(),
        headers={"Content-Type": "text/plain", **target},
        timeout=60,
    )
    assert plain.status_code == 200 and np.allclose(plain.json(), want[0], atol=1e-5)
    bad = requests.post(f"{url}/invocations", json={"inputs": 3}, headers=target, timeout=60)
    assert bad.status_code == 400 and "must be a string" in bad.json()["error"]
    # packaged without --truncation: the artifact's truncation off, 413
    long = requests.post(
        f"{url}/invocations", json={"inputs": " ".join(["long"] * 400)}, headers=target, timeout=60
    )
    assert long.status_code == 413 and "at most 256 tokens" in long.json()["error"], long.text


def standin_imports(log: Path) -> dict[int, dict]:
    """pid -> the Neuron variables when that process imported torch_neuronx (stand-in)."""
    import json

    out = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        e = json.loads(line)
        if e["event"] == "import" and e["module"] == "torch_neuronx":
            out[e["pid"]] = e["env"]
    return out


class NeuronServing:
    """Package models (`fields`: the spec's `models` or `artifact`) for TorchServe or
    Triton and start that server as its users do, on a fake 4-NeuronCore host with the
    stand-in SDK on the workers' path; `stop()` stops it. The stand-in logs to
    `self.log`."""

    def __init__(self, work: Path, server: str, **fields):
        from plugin_servers import start_torchserve, start_tritonserver

        work.mkdir(parents=True, exist_ok=True)
        self.work, self.kind, self.log = work, server, work / "standin.jsonl"
        self.env = {
            **os.environ,
            **standin_env(4, log=self.log, devices=work / "devices"),
            "NEURONSERVE_LEASE_DIR": str(work / "leases"),
        }
        self.spec = write_spec(
            work, token_auth=False, model_store="store", triton_repository="repo", **fields
        )
        run_cli("package", server, "--spec", "deploy.yaml", cwd=work, env=self.env)
        if server == "torchserve":
            self.server = start_torchserve(work / "store", work / "ts", self.env)
        else:
            self.server = start_tritonserver(work / "repo", work, self.env)

    def stop(self) -> None:
        from plugin_servers import stop_torchserve, stop_tritonserver

        if self.kind == "torchserve":
            stop_torchserve(self.server, self.work / "ts", self.env)
        else:
            stop_tritonserver(self.server)


def start_sagemaker(work: Path, artifacts: list[Path]) -> SageMakerServe:
    """The `serve` entrypoint of a fresh build context, its packaged models as
    /opt/ml/model, asked for 9 workers (more than the host's groups); returns once /ping
    says 200, with every /ping answer before that in `.seen`."""
    import shutil

    ctx = sagemaker_context(work, artifacts)
    shutil.copytree(ctx / "model", work / "opt_ml_model")  # what a user puts in model_data
    serve = SageMakerServe(
        ctx,
        work / "opt_ml_model",
        work,
        SAGEMAKER_MODEL_SERVER_WORKERS="9",
        SAGEMAKER_MODEL_SERVER_TIMEOUT="30",
    )
    try:
        serve.seen = serve.watch_until_ready()
    except BaseException:
        serve.stop()
        raise
    return serve


def check_ping_and_workers(serve: SageMakerServe) -> None:
    assert 503 in serve.seen[:-1], serve.seen  # answered, but not ready, before it was ready
    assert "SAGEMAKER_MODEL_SERVER_WORKERS=9 capped to" in serve.log.read_text()


def standin_env(
    cores: int = 4,
    granted: str | None = None,
    sdk: str | None = None,
    log: Path | None = None,
    devices: Path | None = None,
) -> dict[str, str]:
    """Environment variables of a fake Neuron host for processes that import the stand-in
    SDK (tests/neuron_standin): `cores` NeuronCores (0: no device), a container's `granted`
    subset, the SDK release it pretends to be, where it logs, where its cores are reserved
    (`devices`: one host per folder), its neuron-ls on PATH."""
    env = {
        "NEURON_STANDIN_CORES": str(cores),
        "PATH": f"{STANDIN / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])),
    }
    if granted:
        env["NEURON_STANDIN_GRANTED"] = granted
    if sdk:
        env["NEURON_STANDIN_SDK"] = sdk
    if log:
        env["NEURONSERVE_STANDIN_LOG"] = str(log)
    if devices:
        env["NEURON_STANDIN_DEVICE_DIR"] = str(devices)
    return env


def standin_events(log: Path, event: str | None = None) -> list[dict]:
    import json

    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [e for e in events if event is None or e["event"] == event]


@contextlib.contextmanager
def standin_process(
    cores: int = 4, granted: str | None = None, sdk: str | None = None, log: Path | None = None
):
    """This process on a fake Neuron host with the stand-in SDK importable: a fresh stand-in
    runtime, and the environment and sys.path as they were afterwards."""
    env = standin_env(cores, granted, sdk, log)
    env.pop("PYTHONPATH")
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(STANDIN))
    for name in (
        "torch_neuronx",
        "torch_neuronx.experimental",
        "torch_neuron",
        "torch_neuron.experimental",
        "neuronxcc",
        "_standin_trace",
    ):
        sys.modules.pop(name, None)
    import _standin_runtime
    import torch

    # importing the stand-in torch_neuron sets torch.neuron, as the SDK does: put back what
    # was there, or a later test's library takes it for a Neuron device (transformers asks
    # torch.neuron.is_available(), which Inf1's module never had)
    had_neuron = hasattr(torch, "neuron")
    neuron = getattr(torch, "neuron", None)
    _standin_runtime.reset()
    try:
        yield
    finally:
        if had_neuron:
            torch.neuron = neuron
        elif hasattr(torch, "neuron"):
            del torch.neuron
        sys.path.remove(str(STANDIN))
        for name in (
            "torch_neuronx",
            "torch_neuronx.experimental",
            "torch_neuron",
            "torch_neuron.experimental",
            "neuronxcc",
        ):
            sys.modules.pop(name, None)
        _standin_runtime.reset()
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tiny_bert_classifier(out: Path, minilm_dir: Path, seed: int, **config) -> Path:
    """A tiny BERT sequence classifier with random weights (`seed`) and the MiniLM
    tokenizer; `config` sets its labels."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    bert = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **config,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(bert).eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


# tiny configs of every architecture the text tasks are tested on (random weights)
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
ARCHITECTURES = {
    "bert": ("BertConfig", TINY),
    "roberta": ("RobertaConfig", {**TINY, "type_vocab_size": 2, "pad_token_id": 0}),
    "xlm-roberta": ("XLMRobertaConfig", {**TINY, "type_vocab_size": 2, "pad_token_id": 0}),
    "distilbert": ("DistilBertConfig", {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}),
    "albert": ("AlbertConfig", {**TINY, "embedding_size": 16}),
    "electra": ("ElectraConfig", {**TINY, "embedding_size": 16}),
    "mpnet": ("MPNetConfig", TINY),
    "deberta-v2": ("DebertaV2Config", TINY),
}
AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "rerank": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
    "sparse-embedding": "AutoModelForMaskedLM",
}
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "MISC"]


def tiny_model(
    out: Path, tokenizer_dir: Path, task: str, arch: str = "bert", seed: int = 0, **config
) -> Path:
    """A tiny `arch` model with random weights (`seed`) and the head `task` needs, with
    the tokenizer from `tokenizer_dir`. Token classification gets NER_LABELS."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config_class, sizes = ARCHITECTURES[arch]
    if task == "token-classification":
        config.setdefault("id2label", dict(enumerate(NER_LABELS)))
        config.setdefault("label2id", {v: k for k, v in enumerate(NER_LABELS)})
    if task == "rerank":
        config.setdefault("num_labels", 1)
    cfg = getattr(transformers, config_class)(
        vocab_size=len(tok), max_position_embeddings=160, **{**sizes, **config}
    )
    torch.manual_seed(seed)
    model = getattr(transformers, AUTO_CLASSES[task]).from_config(cfg).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def compile_model(spec, progress: bool = True) -> Path:
    """A deployment spec's compile, as `neuronserve compile` runs it but without the
    artifact cache (each test builds its own)."""
    from neuronserve.compile.driver import compile_job
    from neuronserve.compile.job import CompileJob

    return compile_job(CompileJob.of(spec), progress)


def compile_artifact(out: Path, model_dir: Path, task: str, **fields) -> Path:
    """`model_dir` compiled for the CPU at fp32 over a small grid (batch 1 and 4, 16 and
    32 tokens, so long texts and large requests cross buckets), truncation off, one
    module format (TorchScript's) unless `fields` name a target or a format: the builds
    of each format and precision have tests of their own (compile/test_precision.py)."""
    from neuronserve.spec import load_spec

    one_format = (
        {} if "target" in fields or "precision" in fields else {"module_format": "torchscript"}
    )
    spec = {
        "artifact": out,
        "model": model_dir,
        "task": task,
        "batch_sizes": [1, 4],
        "sequence_lengths": [16, 32],
        "precision": "fp32",
        "truncation": False,
        **one_format,
        **fields,
    }
    return compile_model(load_spec(None, spec), progress=False)


def qa_reference(model_dir: Path, question: str, context: str, max_length: int, **p) -> object:
    """The transformers 4.x question-answering pipeline's answer (the pipeline is gone
    from transformers 5), computed its own way: the transformers tokenizer's overflowing
    windows, the eager model on each, its postprocess written out."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    top_k, max_len = p.get("top_k", 1), p.get("max_answer_len", 15)
    impossible = p.get("handle_impossible_answer", False)
    stride = p.get("doc_stride") or min(128, max_length // 2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    enc = tok(
        question,
        context,
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    answers, null = [], 1.0
    for w in range(len(enc["input_ids"])):
        ids = torch.tensor([enc["input_ids"][w]])
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if (
            "token_type_ids" in enc
            and "token_type_ids" in inspect.signature(model.forward).parameters
        ):
            kwargs["token_type_ids"] = torch.tensor([enc["token_type_ids"][w]])
        with torch.no_grad():
            out = model(**kwargs)
        seq_ids = enc.sequence_ids(w)
        context_tokens = np.array([s == 1 for s in seq_ids])
        context_tokens[0] = True
        probs = []
        for logits in (out.start_logits[0].numpy(), out.end_logits[0].numpy()):
            x = np.where(context_tokens, logits, -10000.0)
            x = np.exp(x - x.max())
            probs.append(x / x.sum())
        start, end = probs
        null = min(null, float(start[0] * end[0]))
        start[0] = end[0] = 0.0
        scores = np.tril(np.triu(np.outer(start, end)), max_len - 1)
        spans = sorted(
            ((scores[s, e], s, e) for s in range(len(start)) for e in range(len(end))),
            key=lambda x: -x[0],
        )[:top_k]
        e_w = enc.encodings[w]
        for score, s, e in spans:
            if not (context_tokens[s] and context_tokens[e]):
                continue
            a = e_w.word_to_chars(e_w.token_to_word(s), 1)[0]
            b = e_w.word_to_chars(e_w.token_to_word(e), 1)[1]
            answers.append({"score": float(score), "start": a, "end": b, "answer": context[a:b]})
    if impossible:
        answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
    answers = sorted(answers, key=lambda a: -a["score"])[:top_k]
    return answers[0] if len(answers) == 1 else answers


def as_sent(answer):
    """An answer as a client reads it: written as the servers write it (orjson: float32
    in the fewest digits that read back as the same float32) and parsed again."""
    return orjson.loads(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY))


def _significant(number: str) -> str:
    return number.lower().split("e")[0].lstrip("-").replace(".", "").strip("0") or "0"


def float32_in_fewest_digits(body: bytes) -> bool:
    """Every number in a JSON body is written in the fewest significant digits that read
    back as the same float32 (not a float64's 17)."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", body.decode())
    return bool(numbers) and all(
        _significant(n) == _significant(np.format_float_scientific(np.float32(n), unique=True))
        for n in numbers
    )


def same_answers(got, want, atol: float = 1e-4) -> bool:
    """Equal JSON answers, floats (scores) within `atol`; arrays as a client reads them."""
    got, want = (x.tolist() if isinstance(x, np.ndarray) else x for x in (got, want))
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same_answers(got[k], want[k], atol) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(same_answers(g, w, atol) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, (float, np.floating)) and not isinstance(want, bool):
        return isinstance(got, (int, float)) and abs(float(got) - float(want)) <= atol
    return got == want or (isinstance(want, np.integer) and got == int(want))


VIT_LABELS = {0: "cat", 1: "dog", 2: "car", 3: "tree", 4: "lake"}


def tiny_vit(out: Path, task: str, seed: int = 0, image_size: int = 32, **config) -> Path:
    """A tiny ViT with random weights and the ViT image processor at `image_size`:
    a classifier (VIT_LABELS) for image-classification, the bare model otherwise."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor, ViTModel

    cfg = ViTConfig(
        image_size=image_size,
        patch_size=8,
        **TINY,
        num_labels=len(VIT_LABELS),
        id2label=VIT_LABELS,
        label2id={v: k for k, v in VIT_LABELS.items()},
        **config,
    )
    torch.manual_seed(seed)
    kind = ViTForImageClassification if task == "image-classification" else ViTModel
    kind(cfg).eval().save_pretrained(out)
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(out)
    return out


def triton_rows(name: str, values: list) -> object:
    """A tritonclient BYTES input of one row per value (text or encoded bytes), as a
    Triton user builds TEXT, TEXT_PAIR and IMAGE."""
    import tritonclient.http as httpclient

    t = httpclient.InferInput(name, [len(values), 1], "BYTES")
    raw = [v if isinstance(v, bytes) else v.encode() for v in values]
    t.set_data_from_numpy(np.array([[v] for v in raw], dtype=object))
    return t


def settled(pending: list) -> list:
    """The results of tritonclient async requests sent together, each an InferResult or
    the InferenceServerException its request got."""
    from tritonclient.utils import InferenceServerException

    out = []
    for p in pending:
        try:
            out.append(p.get_result())
        except InferenceServerException as e:
            out.append(e)
    return out


def wait_for_more(results: list, more: int, timeout_s: float = 120) -> None:
    """Until `more` further answers have come in."""
    want, deadline = len(results) + more, time.monotonic() + timeout_s
    while len(results) < want:
        assert time.monotonic() < deadline, "the clients stopped getting answers"
        time.sleep(0.01)


def counter_total(metrics: str, name: str) -> float:
    """The sum of Prometheus counter `name` over all its label sets in `metrics`."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{")
    )


# the Hub id the tests serve the tiny embedder as, from a pre-filled cache (hub_cache)
HUB_TEST_ID = "neuronserve-tests/tiny-embedder"


def hub_cache(cache: Path, repo_id: str, model_dir: Path, commit: str = "1" * 40) -> Path:
    """A Hugging Face cache (huggingface_hub's layout: models--org--name/refs/main and
    snapshots/<commit>/) holding `model_dir` as `repo_id` at `commit`: what a download
    leaves, so tests run offline (HF_HUB_OFFLINE=1, HF_HUB_CACHE=`cache`)."""
    import shutil

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, repo / "snapshots" / commit, dirs_exist_ok=True)
    return cache


def through_the_wire(results):
    """One request's results as a worker's answer frame carries them to the front, read
    back (neuronserve.workers.wire; its fixed part: two u32 sizes and the i64 id)."""
    import struct

    from neuronserve.workers import wire

    data = memoryview(wire.answer({"id": 1, "status": 200}, results))
    _, head_size, _ = struct.unpack_from("<IIq", data)
    head = orjson.loads(data[16 : 16 + head_size])
    return wire.results(head, data[16 + head_size :])
