"""The stand-in's device-time mode (the Inferentia simulation the benchmarks run): a call
of inputs computed before holds its NeuronCore for the published time without using the
CPU, one call at a time per core, and its busy time is what the stand-in's neuron-monitor
reports; the Runner's pipelined path gives the same answers as one call per batch."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import STANDIN, standin_env, standin_process

from neuronserve.host_load import NeuronMonitor, core_utilization


@pytest.fixture
def device_time(monkeypatch, tmp_path):
    """This process on a fake 1-core host in device-time mode, with a table slow enough to
    time: 40 ms at batch 1, 100 ms at batch 4, at the tiny artifact's length 16."""
    monkeypatch.setenv("NEURON_STANDIN_DEVICE_DIR", str(tmp_path / "devices"))
    with standin_process(4):
        import _standin_runtime as rt

        monkeypatch.setitem(rt.DEVICE_TIMES, "test", {"seq": 16, "batch_ms": {1: 40.0, 4: 100.0}})
        monkeypatch.setenv("NEURON_STANDIN_DEVICE_TIME", "test")
        yield rt


def test_the_published_table_is_interpolated_in_batch_and_scaled_by_length():
    import sys

    sys.path.insert(0, str(STANDIN))
    try:
        import _standin_runtime as rt
    finally:
        sys.path.remove(str(STANDIN))
    assert rt.device_ms("inf2-bert-base", 1, 128) == pytest.approx(1.00)
    assert rt.device_ms("inf2-bert-base", 8, 128) == pytest.approx(5.97)
    assert rt.device_ms("inf2-bert-base", 8, 64) == pytest.approx(5.97 / 2)
    # between the published sizes on the line through them, beyond it at the same slope
    assert rt.device_ms("inf2-bert-base", 4, 128) == pytest.approx(1.00 + 3 * 4.97 / 7)
    assert rt.device_ms("inf2-bert-base", 16, 128) == pytest.approx(5.97 + 8 * 4.97 / 7)
    assert rt.device_ms("inf2-distilbert", 16, 128) == pytest.approx(6.01)


def _module(neuronx_artifact, bucket):
    from neuronserve.runtime import Runner

    runner = Runner(neuronx_artifact, warmup=False)
    return runner, runner.executor.module_for(bucket)


def _afresh(module, *inputs: torch.Tensor) -> torch.Tensor:
    """`module`'s answer computed on the CPU with device time off: the reference a kept
    answer is checked against."""
    table = os.environ.pop("NEURON_STANDIN_DEVICE_TIME")
    try:
        return module(*inputs)
    finally:
        os.environ["NEURON_STANDIN_DEVICE_TIME"] = table


def test_a_repeated_call_holds_the_core_for_its_time_without_the_cpu(device_time, neuronx_artifact):
    from neuronserve.buckets import Bucket

    _, module = _module(neuronx_artifact, Bucket(4, 16))
    ids = torch.randint(1000, 2000, (4, 16))
    inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    first = module(*inputs)  # computed on the CPU, kept
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(5):
        again = module(*inputs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert torch.equal(first, again)
    assert wall >= 5 * 0.100 * 0.95  # the published time (less the measured wake-up)
    assert cpu < 0.25 * wall  # the device's time, not the host's
    # other inputs of the same shape are computed, so answers stay right
    other = torch.randint(2000, 3000, (4, 16))
    mask = torch.ones_like(other)
    expected = _afresh(module, other, mask, torch.zeros_like(other))
    assert torch.allclose(module(other, mask, torch.zeros_like(other)), expected)


def test_rows_seen_in_another_batch_are_answered_at_the_devices_pace(device_time, neuronx_artifact):
    """A server under load batches the same texts with padding rows in every count up to
    the bucket's: each composition of rows computed before, in any order, is the device's
    time and the answer computed afresh, not another CPU computation."""
    from neuronserve.buckets import Bucket

    _, module = _module(neuronx_artifact, Bucket(4, 16))
    ids = torch.randint(1000, 2000, (4, 16))
    ids[3] = 0  # a padding row: all padding, mask zero
    mask = torch.ones_like(ids)
    mask[3] = 0
    module(ids, mask, torch.zeros_like(ids))  # computed on the CPU, each row kept
    order = torch.tensor([3, 0, 3, 2])  # one text and three padding rows, another order
    again = (ids[order], mask[order], torch.zeros_like(ids))
    core = device_time._cores[device_time._models[module.handle][1]]
    busy = core.busy_s
    held = module(*again)
    assert core.busy_s - busy == pytest.approx(0.100)  # the device's time, kept rows
    assert torch.allclose(held, _afresh(module, *again), atol=1e-5)


def test_rows_one_bucket_computed_are_the_devices_time_in_another(device_time, neuronx_artifact):
    """Every bucket's module of one model answers a row alike: rows the batch-1 module
    computed (a worker's warm-up, a lone request) cost the batch-4 module no CPU, and its
    answer is the one computed afresh."""
    from neuronserve.buckets import Bucket

    runner, one = _module(neuronx_artifact, Bucket(1, 16))
    four = runner.executor.module_for(Bucket(4, 16))
    assert one.handle != four.handle
    text = torch.randint(1000, 2000, (1, 16))
    pad = torch.zeros_like(text)
    for ids in (text, pad):
        one(ids, (ids != 0).long(), torch.zeros_like(ids))  # computed on the CPU, kept
    ids = torch.cat([text, pad, pad, text])
    inputs = (ids, (ids != 0).long(), torch.zeros_like(ids))
    assert device_time._models[four.handle][1] not in device_time._cores  # never ran
    held = four(*inputs)
    # held for the device's time (a computed call counts none)
    assert device_time._cores[device_time._models[four.handle][1]].busy_s == pytest.approx(0.100)
    assert torch.allclose(held, _afresh(four, *inputs), atol=1e-5)


def test_a_new_row_in_a_full_batch_costs_one_row(device_time, neuronx_artifact, monkeypatch):
    """A row not kept is computed alone and once, on the model's batch-1 module once that
    has run: a benchmark's first text arriving in a full batch (the same text in most
    rows) costs one row of CPU, not the batch's; the answer is the one the batch's own
    module computes."""
    from neuronserve.buckets import Bucket

    runner, one = _module(neuronx_artifact, Bucket(1, 16))
    four = runner.executor.module_for(Bucket(4, 16))
    pad = torch.zeros((1, 16), dtype=torch.long)
    one(pad, pad, pad)  # the batch-1 module has run; the padding row is kept
    texts = torch.randint(1000, 2000, (2, 16))
    ids = torch.cat([texts[:1], texts[1:], pad, texts[1:]])
    inputs = (ids, (ids != 0).long(), torch.zeros_like(ids))
    computed: list[int] = []
    real = device_time._outputs

    def spy(graph, tensors):
        computed.append(tensors[0].shape[0])
        return real(graph, tensors)

    monkeypatch.setattr(device_time, "_outputs", spy)
    answer = four(*inputs)
    assert computed == [1, 1]  # the two new rows, each alone and once
    computed.clear()
    assert torch.equal(four(*inputs), answer)  # every row kept now: the device's time
    assert computed == []
    assert torch.allclose(answer, _afresh(four, *inputs), atol=1e-5)


def test_another_models_rows_are_its_own(device_time):
    """Rows are shared by the modules of one model only: a model with the same weights and
    other operations (another pooling, an auto-cast) or the same operations and other
    weights computes its own answer."""
    import torch_neuronx

    class Head(torch.nn.Module):
        def __init__(self, linear: torch.nn.Linear, relu: bool) -> None:
            super().__init__()
            self.linear, self.relu = linear, relu

        def forward(self, x):
            y = self.linear(x)
            return y.relu() if self.relu else y

    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 4)
    models = {  # the same tensors by the same names; another operation; other weights
        "linear": Head(linear, relu=False),
        "relu": Head(linear, relu=True),
        "other weights": Head(torch.nn.Linear(16, 4), relu=False),
    }
    x = torch.randn(2, 16)
    traced = {name: torch_neuronx.trace(m, x, compiler_args=["--auto-cast", "none"])
              for name, m in models.items()}  # fmt: skip
    for name, module in traced.items():
        with torch.no_grad():
            want = models[name](x)
        assert torch.allclose(module(x), want, atol=1e-6), name
        assert torch.allclose(module(x), want, atol=1e-6), name  # kept, the device's time
    again = torch_neuronx.trace(models["linear"], x, compiler_args=["--auto-cast", "none"])
    busy = {core: c.busy_s for core, c in device_time._cores.items()}
    assert torch.allclose(again(x), models["linear"](x).detach(), atol=1e-6)
    core = device_time._models[again.handle][1]
    # the same model's rows: held for the device's time, not computed
    assert device_time._cores[core].busy_s > busy.get(core, 0.0)


def test_a_core_runs_one_call_at_a_time_and_its_busy_time_is_counted(device_time, neuronx_artifact):
    from neuronserve.buckets import Bucket

    _, module = _module(neuronx_artifact, Bucket(1, 16))
    ids = torch.randint(1000, 2000, (1, 16))
    inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    module(*inputs)
    core = device_time._cores[device_time._models[module.handle][1]]
    busy = core.busy_s
    threads = [threading.Thread(target=module, args=inputs) for _ in range(4)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # four threads, one core: the calls queued (40 ms each), none overlapped
    assert time.perf_counter() - t0 >= 4 * 0.040 * 0.95
    assert core.busy_s - busy == pytest.approx(4 * 0.040)


def test_the_standins_neuron_monitor_reports_the_busy_share(
    device_time, neuronx_artifact, tmp_path
):
    from neuronserve.buckets import Bucket

    _, module = _module(neuronx_artifact, Bucket(1, 16))
    ids = torch.randint(1000, 2000, (1, 16))
    inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    module(*inputs)
    config = tmp_path / "monitor.json"
    config.write_text(json.dumps({"period": "0.5s"}))
    env = {**os.environ, **standin_env(4, devices=tmp_path / "devices")}
    monitor = subprocess.Popen(
        [str(STANDIN / "bin" / "neuron-monitor"), "-c", str(config)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        stop = time.monotonic() + 1.6
        while time.monotonic() < stop:  # busy, back to back
            module(*inputs)
        reports = [json.loads(monitor.stdout.readline()) for _ in range(3)]
    finally:
        monitor.terminate()
    core = device_time._models[module.handle][1]
    busiest = max(core_utilization(r).get(core, 0.0) for r in reports)
    assert 70.0 <= busiest <= 100.0, reports
    assert reports[0]["neuron_runtime_data"][0]["pid"] == os.getpid()


def test_the_pipelined_runner_answers_as_one_call_per_batch(device_time, neuronx_artifact):
    from neuronserve.execution import RunReport
    from neuronserve.runtime import Runner
    from neuronserve.worker import Worker

    os.environ.pop("NEURON_STANDIN_DEVICE_TIME")  # every call computed: answers compared
    plain = Runner(neuronx_artifact, pipeline=False)
    piped = Runner(neuronx_artifact)  # a Neuron target pipelines by default
    assert piped.group_rows and not plain.group_rows
    # a worker begins a batch for the device's threads only where every model has them
    assert Worker(None, {"piped": piped}).pipelined  # type: ignore[arg-type]
    assert not Worker(None, {"piped": piped, "plain": plain}).pipelined  # type: ignore[arg-type]
    bodies = [({"inputs": f"request {i} " * (1 + i % 5)}, None) for i in range(11)]
    bodies[5] = ({"inputs": ["a", "b"], "parameters": {"no such": 1}}, None)  # refused alone
    bodies[7] = ({"inputs": ["one", "two", "three"]}, None)
    report = RunReport()
    got = piped.responses_for_bodies(bodies, report)
    want = plain.responses_for_bodies(bodies)
    assert len(report.runs) > 1  # served in groups
    assert report.requests == len(bodies) and report.texts == 12
    for g, w in zip(got, want, strict=True):
        if isinstance(w, Exception):
            assert type(g) is type(w) and g.status == w.status
            continue
        # rows padded into other buckets: equal up to float rounding
        g, w = json.loads(json.dumps(g)), json.loads(json.dumps(w))
        labels = [[x["label"] for x in row] for row in (w if isinstance(w[0], list) else [w])]
        assert labels == [
            [x["label"] for x in row] for row in (g if isinstance(g[0], list) else [g])
        ]
        scores = [x["score"] for row in (w if isinstance(w[0], list) else [w]) for x in row]
        got_scores = [x["score"] for row in (g if isinstance(g[0], list) else [g]) for x in row]
        assert got_scores == pytest.approx(scores, abs=1e-5)


def test_the_device_thread_only_calls_the_modules(device_time, neuronx_artifact, monkeypatch):
    """Padding and unpadding run beside the device's calls: the caller pads, the
    finishing thread unpads (a caller that waits for its answers too: one pipeline), so
    the device thread goes from one call to the next; a group whose padding fails fails
    only its own requests."""
    from neuronserve import execution
    from neuronserve.runtime import Runner

    runner = Runner(neuronx_artifact)
    where: dict[str, set[str]] = {"pad": set(), "unpad": set(), "call": set()}

    def recorded(name, fn):
        def wrapper(*args, **kwargs):
            where[name].add(threading.current_thread().name)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(execution, "pad_batch", recorded("pad", execution.pad_batch))
    monkeypatch.setattr(execution, "unpad", recorded("unpad", execution.unpad))
    module_for = runner.executor.module_for
    monkeypatch.setattr(
        runner.executor, "module_for", lambda bucket: recorded("call", module_for(bucket))
    )
    texts = runner.group_rows * 3
    caller = threading.current_thread().name
    for _ in range(2):  # answered in place, then begun and waited for
        answers = runner.responses_for_bodies(
            [({"inputs": f"text {i}"}, None) for i in range(texts)]
        )
        assert not any(isinstance(a, Exception) for a in answers)
        assert where["pad"] == {caller} and len(where["call"]) == 1
        assert len(where["unpad"]) == 1 and not where["unpad"] & {caller, *where["call"]}
        for seen in where.values():
            seen.clear()
        batch = [runner.parse({"inputs": f"text {i}"}) for i in range(texts)]
        assert not any(isinstance(a, Exception) for a in runner.start(batch).result(timeout=30))

    plan = runner.executor.plan
    calls = {"n": 0}

    def second_fails(rows):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("padding broke")
        return plan(rows)

    monkeypatch.setattr(runner.executor, "plan", second_fails)
    answers = runner.responses_for_bodies([({"inputs": f"text {i}"}, None) for i in range(texts)])
    failed = [i for i, a in enumerate(answers) if isinstance(a, Exception)]
    assert failed == list(range(runner.group_rows, 2 * runner.group_rows))
    assert {answers[i].status for i in failed} == {500}


def test_a_pipelined_runner_takes_the_next_batch_while_the_device_runs_one(
    device_time, neuronx_artifact
):
    """`start` returns once a batch is queued for the device, so a worker can
    parse the next batch meanwhile; with two in flight a third waits for the first to be
    answered; every batch gets the answers of one call."""
    from neuronserve.inflight import IN_FLIGHT
    from neuronserve.runtime import Runner

    runner = Runner(neuronx_artifact)

    def batch():
        return [runner.parse({"inputs": f"text {i}"}) for i in range(runner.group_rows)]

    want = runner.outputs(batch())  # computed once, then each call holds the core (40+ ms)
    assert IN_FLIGHT == 2
    first = runner.start(batch())
    second = runner.start(batch())
    assert not first.done() and not second.done()  # both queued, the device on the first
    third = runner.start(batch())  # waited for a slot
    assert first.done() and not third.done()
    for started in (first, second, third):  # the later ones in larger calls: other buckets
        got = started.result(timeout=30)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert np.allclose(np.asarray(g), np.asarray(w), atol=1e-5)
    runner.close()


def test_a_batch_whose_worker_fails_to_begin_a_model_answers_its_other_requests(
    device_time, neuronx_artifact
):
    """A worker's batch for two models where one cannot be begun (closed since the
    parse): its requests get the error, the other model's are answered."""
    from neuronserve.runtime import Runner
    from neuronserve.tasks import RequestError
    from neuronserve.worker import Worker

    runner = Runner(neuronx_artifact, name="kept")
    dropped = Runner(neuronx_artifact, name="dropped", warmup=False)
    dropped.close()
    worker = Worker(SimpleNamespace(release=lambda: None), {"kept": runner})  # type: ignore[arg-type]
    try:
        request = runner.parse({"inputs": "fine"})
        reports = []
        got = worker.start(
            [(runner, request), (dropped, runner.parse({"inputs": "x"})), (runner, request)],
            lambda model, run: reports.append((model, run.requests)),
        ).result(timeout=30)
        assert isinstance(got[1], RequestError) and got[1].status == 500
        assert "serving dropped" in got[1].message
        assert not isinstance(got[0], RequestError) and not isinstance(got[2], RequestError)
        # the same text twice in one call: the same answer, to float32's last bits (two
        # rows of one batch may sum in another order on some CPUs)
        first, last = runner.respond(request, got[0]), runner.respond(request, got[2])
        assert [x["label"] for x in first] == [x["label"] for x in last]
        assert np.allclose([x["score"] for x in first], [x["score"] for x in last], atol=1e-6)
        assert reports == [("kept", 2)]
    finally:
        worker.stop()


def test_the_monitor_reader_follows_neuron_monitors_documented_report():
    # the neuroncore_counters example of the Neuron Monitor User Guide
    report = {
        "neuron_runtime_data": [
            {
                "neuron_runtime_index": 0,
                "error": "",
                "report": {
                    "neuroncore_counters": {
                        "period": 1.000113182,
                        "neuroncores_in_use": {
                            "0": {"neuroncore_utilization": 42.01, "loaded_models": []},
                            "1": {"neuroncore_utilization": 42.02, "loaded_models": []},
                        },
                        "error": "",
                    }
                },
            }
        ]
    }
    assert core_utilization(report) == {0: 42.01, 1: 42.02}
    assert core_utilization({"neuron_runtime_data": [{"error": "no runtime"}]}) == {}
    # another tenant's runtime (a pid not of this deployment) is left out where the
    # report names its pid
    theirs = {**report["neuron_runtime_data"][0], "pid": 4242}
    mine = {"pid": 7, "report": {"neuroncore_counters": {"neuroncores_in_use": {"2": {
        "neuroncore_utilization": 10.0}}}}}  # fmt: skip
    both = {"neuron_runtime_data": [theirs, mine]}
    assert core_utilization(both, owned={7}) == {2: 10.0}
    assert core_utilization(both) == {0: 42.01, 1: 42.02, 2: 10.0}
    monitor = NeuronMonitor()
    monitor.history.append((time.monotonic() + 1.0, {0: 50.0, 1: 70.0}))
    assert monitor.mean_between(time.monotonic() - 1.0, time.monotonic() + 2.0) == 0.6
    assert monitor.mean_between(0.0, 1.0) is None


def test_packages_form_batches_of_several_device_calls(neuronx_artifact):
    from neuronserve.buckets import efficient_batches
    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import model_config
    from neuronserve.packaging.triton import model_config as triton_config
    from neuronserve.spec import load_spec
    from neuronserve.targets import pipeline_depth

    with standin_process(4):
        spec = load_spec(None, {"artifact": neuronx_artifact})
        packaged = prepare(spec)
    m = packaged.models[0].manifest
    unit = max(efficient_batches(m.grid, m.bucket_ms).values() or m.grid.batch_sizes)
    depth = pipeline_depth(m.target)
    assert depth > 1
    assert model_config(spec.torchserve, packaged)["batchSize"] == depth * unit
    config = triton_config(packaged)
    assert max(config.dynamic_batching.preferred_batch_size) == depth * unit
    assert config.max_batch_size >= depth * unit
