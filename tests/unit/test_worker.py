"""The adapter contract (neuronserve.worker): settings written by packaging read back by
both adapters under the same names, one worker start, and the shared metric names."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import as_sent

from neuronserve import metrics
from neuronserve.worker import ModelSettings, WorkerSettings, start_worker


def test_settings_round_trip_through_both_engines_formats(tmp_path, tiny_artifact):
    from google.protobuf import json_format

    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import model_config
    from neuronserve.packaging.triton import model_config as triton_config
    from neuronserve.spec import load_spec

    spec = load_spec(
        None,
        {"cores_per_worker": 1, "truncation": False, "neuron_cores": 3, "artifact": tiny_artifact},
    )
    packaged = prepare(spec)
    # TorchServe: model-config.yaml as the frontend hands it to the handler
    own = spec.torchserve
    yaml_config = yaml.safe_load(yaml.safe_dump(model_config(own, packaged)))
    # Triton: config.pbtxt as the stub hands it to initialize(), JSON
    triton = json.loads(
        json_format.MessageToJson(triton_config(packaged), preserving_proto_field_name=True)
    )
    for settings in (
        WorkerSettings.from_section(yaml_config),
        WorkerSettings.from_parameters(
            {k: v["string_value"] for k, v in triton.get("parameters", {}).items()}
        ),
    ):
        assert settings == packaged.settings
        assert (settings.target, settings.core_kind, settings.cores_per_worker) == ("cpu", "cpu", 1)
        assert settings.neuron_cores == 3
        [model] = settings.models
        assert (model.name, model.artifact, model.truncation) == ("tiny", "models/tiny", False)


def test_both_engines_bound_their_queues_from_the_same_fields(tiny_artifact):
    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import model_config, store_properties
    from neuronserve.packaging.triton import model_config as triton_config
    from neuronserve.spec import load_spec

    spec = load_spec(None, {"max_queued": 7, "queue_timeout_ms": 250, "artifact": tiny_artifact})
    packaged = prepare(spec)
    own = spec.torchserve
    torchserve = model_config(own, packaged)
    assert torchserve["jobQueueSize"] == 7 and torchserve["clientTimeoutInMills"] == 250
    properties = store_properties(own, spec.worker, spec.limits, tiny_artifact)
    assert properties["job_queue_size"] == "7"
    policy = triton_config(packaged).dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 7 and policy.default_timeout_microseconds == 250_000
    assert policy.timeout_action == policy.REJECT
    unbounded_wait = prepare(load_spec(None, {"artifact": tiny_artifact}))
    assert "clientTimeoutInMills" not in model_config(own, unbounded_wait)


def test_start_worker_leases_pins_and_loads(tmp_path, tiny_artifact, monkeypatch):
    import os
    import shutil

    monkeypatch.setenv("NEURONSERVE_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("NEURONSERVE_DEPLOYMENT", "/srv/this-deployment")
    for name in ("a", "b"):
        shutil.copytree(tiny_artifact, tmp_path / "model" / "models" / name)
    before = os.sched_getaffinity(0)
    import torch

    threads = torch.get_num_threads()
    settings = WorkerSettings(
        target="cpu",
        core_kind="cpu",
        models=[
            ModelSettings(name="a", artifact="models/a"),
            ModelSettings(name="b", artifact="models/b", truncation=True),
        ],
    )
    try:
        worker = start_worker(settings, tmp_path / "model", owner="test")
        try:
            assert os.sched_getaffinity(0) == set(worker.lease.cores)
            # both models in this one process, each under its name, with its own settings
            assert list(worker.runners) == ["a", "b"]
            assert not worker.pipelined  # on the CPU a batch runs where it begins
            assert worker.runner("a").truncation is False and worker.runner("b").truncation
            assert (
                "leased cpu core group" in worker.describe() and "b: buckets" in worker.describe()
            )
            record = json.loads(
                (tmp_path / "leases" / f"cpu-core-{worker.lease.cores[0]}.lock").read_text()
            )
            assert record["pid"] == os.getpid() and record["threads"] == 1
            assert record["deployment"] == "/srv/this-deployment"
            _serves_each_model_alone(worker)
        finally:
            worker.stop()
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def _serves_each_model_alone(worker) -> None:
    """A batch of requests for two models: each model's requests go through its Runner in
    a call of their own (never one module run for both), answers in the batch's order, the
    models taking turns at going first; unknown or missing names fail alone."""
    from neuronserve.tasks import RequestError

    texts = ["one", "two", "three", "four"]
    runners = [worker.runner(name) for name in ["a", "b", "a", "b"]]
    batch = [(r, r.parse({"inputs": t})) for r, t in zip(runners, texts, strict=True)]
    calls: list[tuple[str, int]] = []
    results = worker.start(batch, lambda model, run: calls.append((model, run.requests))).result()
    assert sorted(calls) == [("a", 2), ("b", 2)]
    answers = [as_sent(r.respond(req, res)) for (r, req), res in zip(batch, results, strict=True)]
    alone = [as_sent(r.responses([req])[0]) for r, req in batch]
    assert answers == alone
    worker.start(batch, lambda model, run: calls.append((model, run.requests))).result()
    assert calls[0][0] != calls[2][0]  # the other model went first this time
    refused = RequestError("refused while decoding")
    mixed = worker.start([batch[0], (None, refused), batch[1]], lambda *_: None).result()
    assert mixed[1] is refused  # an error is answered as it is
    both = [batch[0][0].respond(batch[0][1], mixed[0]), batch[1][0].respond(batch[1][1], mixed[2])]
    assert [as_sent(a) for a in both] == alone[:2]
    with pytest.raises(RequestError, match="served: a, b") as unknown:
        worker.runner("c")
    assert unknown.value.status == 404
    with pytest.raises(RequestError, match="serves 2 models") as unnamed:
        worker.runner(None)
    assert unnamed.value.status == 400


def test_a_worker_that_cannot_load_gives_its_lease_back(tmp_path, monkeypatch):
    import os

    from neuronserve.artifact import ArtifactError
    from neuronserve.placement import claim

    monkeypatch.setenv("NEURONSERVE_LEASE_DIR", str(tmp_path / "leases"))
    before = os.sched_getaffinity(0)
    try:
        settings = WorkerSettings(
            target="cpu", core_kind="cpu", models=[ModelSettings(name="m", artifact="m")]
        )
        with pytest.raises(ArtifactError, match="not a neuronserve artifact"):
            start_worker(settings, tmp_path, owner="x")
    finally:
        os.sched_setaffinity(0, before)
    n = len(before)
    leases = [claim("cpu", 1) for _ in range(n)]
    assert len(leases) == n  # every group is free again
    for lease in leases:
        lease.release()


def test_metric_names_agree_between_the_adapters_and_the_workers():
    assert metrics.TOKENIZE_MS.camel_name == "NeuronServeTokenizeMs"
    assert metrics.TOKENIZE_MS.snake_name == "neuronserve_tokenize_ms"
    assert metrics.BUCKET_RUNS.camel_name == "NeuronServeBucketRuns"
    # the series bench reads the model's time from: prometheus_client ends a counter in
    # _total on the front's /metrics
    from neuronserve.bench.servers import MODEL_MS_SERIES

    assert metrics.MODEL_MS.kind == "counter"
    assert metrics.MODEL_MS.snake_name + "_total" == MODEL_MS_SERIES
    # running sums are counters on both; last-batch values are gauges on both
    assert {m.name for m in metrics.METRICS if m.kind == "counter"} == {
        "requests",
        "tokenize_ms",
        "model_ms",
        "handler_ms",
        "bucket_runs",
    }


def test_batch_values_from_a_report():
    from neuronserve.buckets import Bucket
    from neuronserve.execution import BucketRun, RunReport

    report = RunReport(
        requests=3,
        texts=4,
        tokenize_ms=1.5,
        runs=[BucketRun(Bucket(4, 16), 3, 20, 2.0), BucketRun(Bucket(1, 64), 1, 50, 3.0)],
    )
    got = {
        (m.name, tuple(sorted(labels.items()))): v
        for m, v, labels in metrics.batch_values(report, "mini")
    }
    own = (("model", "mini"),)
    assert got[("requests", own)] == 3 and got[("model_ms", own)] == 5.0
    assert got[("bucket_runs", (("batch_size", "3"), ("bucket", "b4_s16"), *own))] == 1
    assert got[("padding_ratio", own)] == pytest.approx((64 + 64 - 70) / 70)
    shared = {labels["model"]: v for _, v, labels in metrics.handler_values(9.0, {"a": 2, "b": 1})}
    assert shared == {"a": 6.0, "b": 3.0}  # a batch's handler time, by each model's requests


def test_batch_delay_zero_means_no_wait_on_both_engines(tiny_artifact):
    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import model_config
    from neuronserve.packaging.triton import model_config as triton_config
    from neuronserve.spec import load_spec

    default = load_spec(None, {"artifact": tiny_artifact})
    assert default.worker.max_batch_delay_ms == 0
    packaged = prepare(default)
    own = default.torchserve
    # Triton forms a batch of what is queued when an instance is free
    assert triton_config(packaged).dynamic_batching.max_queue_delay_microseconds == 0
    # TorchServe reads 0 as its 100 ms default: its least delay that still batches is 1 ms
    assert model_config(own, packaged)["maxBatchDelay"] == 1
    waits = prepare(load_spec(None, {"artifact": tiny_artifact, "max_batch_delay_ms": 7}))
    assert model_config(own, waits)["maxBatchDelay"] == 7
    assert triton_config(waits).dynamic_batching.max_queue_delay_microseconds == 7000


def test_deferred_metrics_sum_counters_keep_the_last_gauge_and_flush_when_idle():
    import threading
    import time

    from helpers import wait_for

    emitted: list[tuple[str, float, dict]] = []
    lock = threading.Lock()

    def emit(metric, value, labels):
        if metric is metrics.PADDING_RATIO and value < 0:
            raise RuntimeError("a broken metrics sink")
        with lock:
            emitted.append((metric.name, value, labels))

    deferred = metrics.DeferredMetrics(emit, interval_s=0.3)
    t0 = time.monotonic()
    deferred.add([(metrics.REQUESTS, 2, {}), (metrics.BATCH_REQUESTS, 2, {})])
    deferred.add([(metrics.REQUESTS, 3, {}), (metrics.BATCH_REQUESTS, 3, {})])
    # labels given out of order come out in the metric's own (TorchServe pairs by position)
    runs = {"batch_size": "1", "bucket": "b1_s8"}
    deferred.add([(metrics.BUCKET_RUNS, 1, runs), (metrics.PADDING_RATIO, -1, {})])
    assert not emitted  # nothing is written while the batch's response is on its way
    # flushed with no further batch: the sums, the last gauge, labels kept
    wait_for(lambda: len(emitted) == 3, 5, 0.01, "the idle flush")
    assert time.monotonic() - t0 >= 0.3
    runs_labels = next(labels for name, _, labels in emitted if name == "bucket_runs")
    assert list(runs_labels) == list(metrics.BUCKET_RUNS.labels)
    assert sorted(emitted, key=lambda e: e[0]) == [
        ("batch_requests", 3.0, {}),
        ("bucket_runs", 1.0, {"bucket": "b1_s8", "batch_size": "1"}),
        ("requests", 5.0, {}),
    ]
    # the sink's failure did not stop the thread: later batches are still written
    deferred.add([(metrics.REQUESTS, 1, {})])
    wait_for(lambda: ("requests", 1.0, {}) in emitted, 5, 0.01, "the next flush")
