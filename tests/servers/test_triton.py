"""A real tritonserver (from the nvidia-pytriton wheel) serving the real MiniLM model
through triton_backend/model.py: two instances pinned to two core groups, HTTP and
gRPC, dynamic batching, per-request errors, metrics and SageMaker mode. One server
for the module, started through the CLI while /ping is watched. Answers are compared
with the Runner's in process (unit/test_runner.py checks the Runner against
transformers)."""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from helpers import REPO, SENTENCES, free_port, run_cli
from tritonclient.utils import InferenceServerException

from neuronserve.bench.servers import scrape
from neuronserve.cores import parse_core_list
from neuronserve.packaging.triton import model_config, read_config
from neuronserve.serve import triton

pytestmark = pytest.mark.server
MODEL = "minilm"


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_artifact):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores for a two-group plan")
    work = tmp_path_factory.mktemp("triton")
    spec = {
        "name": MODEL,
        "artifact": str(minilm_artifact),
        "triton_repository": "repo",
        "triton_run_dir": "run",
        "workers": 2,
        "cores_per_worker": 1,
        "max_batch_delay_ms": 50,
        "http_port": free_port(),
        "grpc_port": free_port(),
        "triton_metrics_port": free_port(),
    }
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec))
    run_cli("package", "triton", "--spec", "deploy.yaml", cwd=work)

    proc = run_cli("serve", "triton", "--spec", "deploy.yaml", cwd=work)
    assert "tritonserver is ready" in proc.stdout
    inst = triton.running(work / "run")
    procs = [psutil.Process(inst.pid()), *psutil.Process(inst.pid()).children(recursive=True)]
    inst.spec, inst.work = spec, work
    yield inst
    out = run_cli("serve", "triton", "--spec", "deploy.yaml", "--stop", cwd=work)
    assert "tritonserver stopped" in out.stdout
    assert not [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _texts(texts, client):
    t = client.InferInput("TEXT", [len(texts), 1], "BYTES")
    t.set_data_from_numpy(
        np.array([[s.encode() if isinstance(s, str) else s] for s in texts], dtype=object)
    )
    return t


def http_embed(inst, texts):
    c = httpclient.InferenceServerClient(inst.http_url.removeprefix("http://"))
    try:
        return c.infer(MODEL, [_texts(texts, httpclient)]).as_numpy("EMBEDDING")
    finally:
        c.close()  # tritonserver waits for open connections before it stops


def runner_rows(runner, texts) -> np.ndarray:
    [rows] = runner.outputs([runner.parse({"inputs": list(texts)})])
    return rows


def test_config_is_triton_protobuf_and_round_trips(server, minilm_artifact):
    path = server.work / "repo" / MODEL / "config.pbtxt"
    parsed = read_config(path)
    from neuronserve.packaging.model import prepare
    from neuronserve.spec import load_spec

    spec = load_spec(server.work / "deploy.yaml")
    assert parsed == model_config(spec, prepare(minilm_artifact, spec))
    assert parsed.backend == "python" and parsed.max_batch_size == 8
    # the batch sizes worth forming by the artifact's bucket times (unit/test_buckets.py)
    preferred = list(parsed.dynamic_batching.preferred_batch_size)
    assert preferred and preferred == sorted(set(preferred)) and set(preferred) <= {1, 4, 8}
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 50_000
    assert parsed.instance_group[0].count == 2
    assert parsed.parameters["neuronserve_artifact"].string_value == "artifact"
    assert (path.parent / "1" / "model.py").read_text() == (
        REPO / "triton_backend" / "model.py"
    ).read_text()


def test_embeddings_over_http_and_grpc_equal_the_runners(server, minilm_runner):
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for i in range(0, len(SENTENCES), 4):  # max_batch_size texts per request at most
        chunk = SENTENCES[i : i + 4]
        via_http = http_embed(server, chunk)
        via_grpc = grpc.infer(MODEL, [_texts(chunk, grpcclient)]).as_numpy("EMBEDDING")
        # sequential requests form the same batch as in process: bit for bit
        assert np.array_equal(via_http, runner_rows(minilm_runner, chunk))
        assert np.array_equal(via_http, via_grpc)


def _stub_pids(inst) -> list[int]:
    server = psutil.Process(inst.pid())
    return [
        p.pid
        for p in server.children(recursive=True)
        if "triton_python_backend_stub" in " ".join(p.cmdline())
    ]


def test_two_instances_in_two_processes_with_distinct_affinity(server, lease_dir):
    pids = _stub_pids(server)
    assert len(pids) == 2
    affinities = []
    for pid in pids:
        per_thread = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            per_thread.add(
                tuple(parse_core_list(re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)))
            )
        assert len(per_thread) == 1, per_thread
        affinities.append(per_thread.pop())
    assert len(set(affinities)) == 2 and all(len(a) == 1 for a in affinities)


def test_dynamic_batching_forms_batches_under_concurrency(server, minilm_runner):
    texts = [f"concurrent request {i} " + "word " * (i % 5) for i in range(24)]
    ref = runner_rows(minilm_runner, texts)
    barrier = threading.Barrier(len(texts))

    def call(i):
        barrier.wait()
        return http_embed(server, [texts[i]])[0]

    before = scrape(server.metrics_url, MODEL)
    with ThreadPoolExecutor(len(texts)) as pool:
        out = list(pool.map(call, range(len(texts))))
    # batched with others, so padded to another bucket: equal to float32 rounding
    assert np.allclose(out, ref, atol=1e-5)
    after = scrape(server.metrics_url, MODEL)
    metrics = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
    # Triton's own counters: every text counted once, in fewer executions than texts.
    # (How the handler then splits a batch into bucket runs follows the artifact's
    # measured bucket times, which may well favour batch-1 runs on a busy host.)
    requests_done, executions = (
        after[name] - before[name] for name in ("nv_inference_count", "nv_inference_exec_count")
    )
    assert requests_done == len(texts) and executions < len(texts), (requests_done, executions)
    assert re.search(r'^neuronserve_bucket_runs\{batch_size="\d+"', metrics, re.M), metrics
    assert "nv_inference_request_success" in metrics  # Triton's own, on the same port
    for name in (
        "neuronserve_padding_ratio",
        "neuronserve_tokenize_ms",
        "neuronserve_batch_model_ms",
        "neuronserve_handler_ms",
    ):
        assert re.search(rf"^{name}\{{", metrics, re.M), name


def test_bad_inputs_fail_alone_while_neighbours_succeed(server, minilm_runner):
    good = ["first good text", "second good text", "third good text"]
    ref = runner_rows(minilm_runner, good)
    c = httpclient

    def wrong_dtype():
        t = c.InferInput("TEXT", [1, 1], "INT32")
        t.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
        return [t]

    def empty():
        t = c.InferInput("TEXT", [0, 1], "BYTES")
        t.set_data_from_numpy(np.zeros((0, 1), dtype=object))
        return [t]

    bad = [
        (wrong_dtype, "INT32"),
        (empty, "expected 1 string elements"),
        # Triton has no 413: the Runner's status travels in the message
        (lambda: [_texts([" ".join(["long"] * 400)], c)], "[413] inputs[0] is 402 tokens"),
        (lambda: [_texts([b"\xff\xfe broken"], c)], "not valid UTF-8"),
    ]
    calls = [(lambda g=g: [_texts([g], c)], None) for g in good] + bad
    barrier = threading.Barrier(len(calls))

    def call(args):
        make, _ = args
        inputs = make()
        # one client per thread: tritonclient's HTTP client (gevent) is not thread-safe
        client = c.InferenceServerClient(server.http_url.removeprefix("http://"))
        barrier.wait()
        try:
            return client.infer(MODEL, inputs).as_numpy("EMBEDDING")
        except InferenceServerException as e:
            return e
        finally:
            client.close()  # tritonserver waits for open connections before it stops

    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(call, calls))
    for i, r in enumerate(results[: len(good)]):
        assert not isinstance(r, Exception), r
        assert np.allclose(r[0], ref[i], atol=1e-5)
    for (_, needle), r in zip(bad, results[len(good) :], strict=True):
        assert isinstance(r, InferenceServerException), r
        assert r.status() == "400" and needle in r.message(), (needle, r.message())
    assert len(_stub_pids(server)) == 2  # no instance died


def test_sagemaker_listener_is_refused_for_the_front(server):
    """Triton's SageMaker listener would bind 0.0.0.0 without a key; the command says to
    use the front, and starts nothing."""
    r = run_cli("serve", "triton", "--spec", "deploy.yaml", "--sagemaker", "--run-dir", "run2",
                cwd=server.work, check=False)  # fmt: skip
    assert r.returncode == 2 and "serve front REPOSITORY --engine triton" in r.stderr
    assert not (server.work / "run2").exists()


def test_repository_and_config_apis_need_the_admin_key(server):
    """Model control is explicit (the healer reloads a model whose stub died), so the
    repository API can load and unload: it and the config API need the key neuronserve
    wrote (0600) into the run directory; without it an unload is refused."""
    import stat

    base = server.http_url
    key_file = server.work / "run" / "admin_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert requests.post(f"{base}/v2/repository/index", timeout=10).status_code == 403
    unload = f"{base}/v2/repository/models/{MODEL}/unload"
    assert requests.post(unload, timeout=10).status_code == 403
    assert requests.get(f"{base}/v2/models/{MODEL}/ready", timeout=10).status_code == 200
    assert requests.get(f"{base}/v2/models/{MODEL}/config", timeout=10).status_code == 403
    r = requests.post(
        f"{base}/v2/repository/index", headers={"neuronserve-admin-key": key}, timeout=10
    )
    assert r.status_code == 200 and r.json()[0]["name"] == MODEL
    # what clients use stays open on loopback: health and inference
    assert requests.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
