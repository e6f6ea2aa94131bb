"""SageMaker's multi-model contract as the front keeps it, in process: the front's app
(Starlette's test client) over workers that are catalog followers in this process, each
loading and dropping Runners as the catalog folder says, exactly as the engine's worker
processes do (neuronserve.catalog). Registration, 409, 507, eviction of the least
recently used idle model, load on demand, delete, pagination, the admin key, and a swap
under concurrent clients. The same contract against TorchServe, Triton and the Neuron
stand-in: tests/servers/test_multi_model_servers.py."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import shutil
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import as_sent, counter_total, wait_for, wait_for_more
from in_process_front import config_of
from starlette.testclient import TestClient

from neuronserve import catalog, placement
from neuronserve.artifact import read_manifest
from neuronserve.runtime import Runner
from neuronserve.serve.front.app import build_app
from neuronserve.serve.front.multi_model import ModelCatalog
from neuronserve.serve.front.serving import Serving
from neuronserve.served import ServedModel
from neuronserve.spec import load_spec
from neuronserve.tasks import RequestError, TaskRequest
from neuronserve.workers.answers import WorkerClient, WorkerCounts

ADMIN = "admin-key"
WORKERS = 2


# (the manifest's bytes, truncation, name) -> its Runner: a worker process loads its own;
# here both workers are handed one, loaded once (a load is most of a test's time), and a
# manifest names every file by its sha256, so the same bytes are the same model
_LOADED: dict[tuple[bytes, bool | None, str], Runner] = {}


def _runner(artifact: Path, truncation: bool | None, name: str) -> Runner:
    key = ((artifact / "manifest.json").read_bytes(), truncation, name)
    if key not in _LOADED:
        _LOADED[key] = Runner(artifact, truncation=truncation, name=name)
    return _LOADED[key]


class FollowingWorkers(WorkerClient):
    """Two workers, each a catalog Follower holding its own Runners; a request goes to
    the next worker, which answers 404 for a model it does not hold (as a real one)."""

    kind = "in-process"

    def __init__(self, folder: Path):
        self.held: list[dict[str, Runner]] = [{} for _ in range(WORKERS)]
        self.followers = []
        # cleared: every load waits until it is set again (a load that takes a while)
        self.gate = threading.Event()
        self.gate.set()
        for group in range(WORKERS):

            def load(name, artifact, truncation, group=group):
                assert self.gate.wait(30)
                return _runner(Path(artifact), truncation, name)

            f = catalog.Follower(
                folder,
                group,
                load,
                lambda group=group: self.held[group],
                lambda models, group=group: self.held.__setitem__(group, models),
            )
            f.start()
            self.followers.append(f)
        self.turn = itertools.count()
        # every model a request reached: the engine's own series go on counting them
        # after an unload, as TorchServe's do
        self.ran: set[str] = set()

    def _runner(self, model: str) -> Runner:
        self.ran.add(model)
        runner = self.held[next(self.turn) % WORKERS].get(model)
        if runner is None:
            raise RequestError(f"no model {model!r} here", status=404)
        return runner

    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        runner = self._runner(model.worker_name)
        await asyncio.sleep(0.005)  # a request spends a moment at the engine
        [result] = runner.outputs([dataclasses.replace(request)])
        if isinstance(result, RequestError):
            raise result
        return result

    async def health(self) -> WorkerCounts:
        return WorkerCounts(WORKERS, WORKERS)

    async def metrics(self) -> str:
        return "".join(
            f'NeuronServeBatchRequests{{ModelName="mme",Level="Model",model="{m}",'
            f'Hostname="h"}} 1.0\n'
            for m in sorted(self.ran)
        )

    async def close(self) -> None:
        for f in self.followers:
            f.stop()


def _same(a: Any, b: Any) -> bool:
    """Equal answers, numbers to float32's precision."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-5 * max(1.0, abs(b))
    return bool(a == b)


def _cost(artifact: Path) -> int:
    return placement.model_memory("m", read_manifest(artifact), artifact, "cpu").total


@pytest.fixture(autouse=True)
def _followers_look_often(monkeypatch):
    # a worker notices a change of the wanted models within POLL_S; these tests make
    # dozens of changes one after another, and what they check does not depend on when
    monkeypatch.setattr(catalog, "POLL_S", 0.005)


@pytest.fixture
def endpoint(tmp_path, tiny_artifact, classifier_artifact):
    """A multi-model front whose budget holds two copies of the tiny embedder, not three;
    `models` holds three copies (a, b, c) and the classifier (cls)."""
    models = tmp_path / "models"
    for name in ("a", "b", "c"):
        shutil.copytree(tiny_artifact, models / name)
    shutil.copytree(classifier_artifact, models / "cls")
    folder = tmp_path / "catalog"
    catalog.write_wanted(folder, {})
    spec = load_spec(None, {"front_run_dir": tmp_path / "run", "multi_model": True})
    config = config_of(spec)
    config = config.__class__(**{**config.__dict__, "admin_keys": None})
    serving = Serving(config)
    workers = FollowingWorkers(folder)
    budget = int(2.5 * _cost(models / "a"))

    def make(name, key, manifest, artifact):
        return ServedModel(
            name, manifest, False, None,
            ServedModel.tokenizer_of(manifest, artifact), key,
        )  # fmt: skip

    serving.catalog = ModelCatalog(serving, folder, WORKERS, "cpu", "cpu", budget, make)
    serving.attach({}, workers)
    with TestClient(build_app(serving)) as client:
        yield client, models, serving, workers
    asyncio.run(workers.close())


def load(client, name, url):
    return client.post("/models", json={"model_name": name, "url": str(url)})


def embed(client, name, text="hello"):
    return client.post(f"/models/{name}/invoke", json={"inputs": text})


def test_a_budget_of_two_holds_two_of_three_and_evicts_the_least_recently_used(
    endpoint, tiny_runner
):
    client, models, _, workers = endpoint
    for name in "ab":
        r = load(client, name, models / name)
        assert r.status_code == 200, r.text
        assert r.json() == {"modelName": name, "modelUrl": str(models / name), "state": "ready"}
    # every worker holds what is listed as ready
    assert all(set(h) == {"a", "b"} for h in workers.held)
    assert embed(client, "a").status_code == 200  # b is now the least recently used
    assert load(client, "c", models / "c").status_code == 200
    states = {m["modelName"]: m["state"] for m in client.get("/models").json()["models"]}
    assert states == {"a": "ready", "b": "evicted", "c": "ready"}
    assert all(set(h) == {"a", "c"} for h in workers.held)
    # cycling through all three: every answer right, each evicted model loaded on demand
    want = as_sent(tiny_runner.responses_for_bodies([({"inputs": "hello"}, None)])[0])
    for name in "bcabca":
        r = embed(client, name)
        assert r.status_code == 200, r.text
        assert r.json() == want
    metrics = client.get("/metrics").text
    assert 'neuronserve_model_evictions_total{model="b"}' in metrics
    evictions = counter_total(metrics, "neuronserve_model_evictions_total")
    assert evictions >= 5
    assert 'neuronserve_model_waited_requests_total{model="b"}' in metrics
    info = client.get("/info").json()
    assert {m["model_id"]: m["state"] for m in info["models"]}.keys() == {"a", "b", "c"}


def test_409_for_a_loaded_name_507_when_nothing_can_be_evicted_400_for_a_bad_url(endpoint):
    client, models, serving, _ = endpoint
    assert load(client, "a", models / "a").status_code == 200
    again = load(client, "a", models / "b")
    assert again.status_code == 409 and "already loaded" in again.json()["error"]
    assert load(client, "b", models / "b").status_code == 200
    # both held by requests in flight: nothing can make room for a third
    held = [serving.table.hold(serving.table.get(n)) for n in "ab"]
    full = load(client, "c", models / "c")
    assert full.status_code == 507, full.text
    assert "requests in flight" in full.json()["error"]
    assert client.get("/models/c").status_code == 404  # a refused load is not listed
    for version in held:
        serving.table.release(version)
    assert load(client, "c", models / "c").status_code == 200
    missing = load(client, "d", models / "nope")
    assert missing.status_code == 400 and "no such file" in missing.json()["error"]
    bad = client.post("/models", json={"model_name": "d"})
    assert bad.status_code == 400 and "url" in bad.json()["error"]


def test_delete_then_invoke_is_404_and_the_others_answer(endpoint):
    client, models, _, workers = endpoint
    load(client, "a", models / "a")
    load(client, "cls", models / "cls")
    r = client.delete("/models/a")
    assert r.status_code == 200 and r.json()["status"] == "unloaded"
    assert all(set(h) == {"cls"} for h in workers.held)
    gone = embed(client, "a")
    assert gone.status_code == 404 and "a" in gone.json()["error"]
    assert client.get("/models/a").status_code == 404
    assert client.delete("/models/a").status_code == 404
    assert embed(client, "cls", "fine").status_code == 200


def test_a_loaded_model_has_a_base_url_until_it_is_deleted(endpoint):
    """A model registered at run time answers at its own base URL once served (loaded
    again on demand after an eviction, like any request for it), and not after a
    DELETE: 404."""
    client, models, _, _ = endpoint
    assert client.post("/models/a/embed", json={"inputs": "hello"}).status_code == 404
    assert load(client, "a", models / "a").status_code == 200
    assert load(client, "cls", models / "cls").status_code == 200
    got = client.post("/models/a/embed", json={"inputs": "hello"})
    assert got.status_code == 200, got.text
    assert got.json() == client.post("/embed", json={"inputs": "hello", "model": "a"}).json()
    assert client.post("/models/cls", json={"inputs": "fine"}).status_code == 200  # its root
    assert client.get("/models/a/info").json()["model_id"] == "a"
    assert client.delete("/models/a").status_code == 200
    for method, path in (("POST", "/models/a/embed"), ("GET", "/models/a/info"),
                         ("GET", "/models/a/health")):  # fmt: skip
        assert client.request(method, path, json={"inputs": "x"}).status_code == 404, path


def test_list_pages_and_describe(endpoint):
    client, models, _, _ = endpoint
    for name in ("a", "b", "cls"):
        load(client, name, models / name)
    first = client.get("/models", params={"max_results": 2}).json()
    assert [m["modelName"] for m in first["models"]] == ["a", "b"]
    token = first["nextPageToken"]
    second = client.get("/models", params={"next_page_token": token, "max_results": 2}).json()
    assert [m["modelName"] for m in second["models"]] == ["cls"]
    assert "nextPageToken" not in second
    one = client.get("/models/cls").json()
    assert one["modelName"] == "cls" and one["modelUrl"] == str(models / "cls")
    assert client.get("/models", params={"max_results": "x"}).status_code == 400


def test_a_tar_gz_url_loads_as_sagemaker_hands_it(endpoint, tmp_path):
    client, models, _, _ = endpoint
    tarball = tmp_path / "model.tar.gz"
    with tarfile.open(tarball, "w:gz") as t:
        for f in (models / "a").iterdir():
            t.add(f, arcname=f.name)
    folder = tmp_path / "s3" / "a"
    folder.mkdir(parents=True)
    shutil.copy(tarball, folder / "model.tar.gz")
    assert load(client, "a", folder).status_code == 200, load(client, "x", folder).text
    assert embed(client, "a").status_code == 200


def test_a_swap_under_16_clients_drops_nothing(endpoint, tiny_runner, classifier_runner):
    """`a` serves the embedder, then the classifier's artifact under the same name:
    every request answers 200 with one model's answer or the other's, never an error;
    after the swap, only the new one's."""
    client, models, _, workers = endpoint
    load(client, "a", models / "a")
    stop = threading.Event()
    results: list[tuple[int, Any]] = []

    def hammer():
        while not stop.is_set():
            r = embed(client, "a", "fine")
            results.append((r.status_code, r.json()))

    with ThreadPoolExecutor(16) as pool:
        for _ in range(16):
            pool.submit(hammer)
        wait_for_more(results, 20)  # traffic flowing before the swap
        swapped = client.put("/models/a", json={"url": str(models / "cls")})
        wait_for_more(results, 20)  # and after it
        stop.set()
    assert swapped.status_code == 200, swapped.text
    old = as_sent(tiny_runner.responses_for_bodies([({"inputs": "fine"}, None)])[0])
    new = as_sent(classifier_runner.responses_for_bodies([({"inputs": "fine"}, None)])[0])
    assert len(results) > 50
    assert all(status == 200 for status, _ in results), [r for r in results if r[0] != 200][:3]
    # one model's answer or the other's (to float32's last digits: joined requests run
    # as one batch)
    kinds = {"old" if _same(body, old) else "new" if _same(body, new) else str(body)
             for _, body in results}  # fmt: skip
    assert kinds == {"old", "new"}, kinds
    assert _same(results[-1][1], new)
    assert all(set(h) == {"a@2"} for h in workers.held)  # the old version dropped
    assert client.get("/models/a").json()["modelUrl"] == str(models / "cls")


def test_model_management_takes_the_admin_key_outside_sagemaker(tmp_path):
    spec = load_spec(None, {"front_run_dir": tmp_path, "multi_model": True})
    config = config_of(spec)
    assert config.admin_keys is not None and config.keys is None  # loopback: no API key
    key = (tmp_path / "admin_key").read_text().strip()
    client = TestClient(build_app(Serving(config)))
    denied = client.get("/models")
    assert denied.status_code == 401 and "admin key" in denied.json()["error"]
    assert key not in denied.text
    # past the key: the engine is not up yet
    allowed = client.get("/models", headers={"Authorization": f"Bearer {key}"})
    assert allowed.status_code == 503
    # SageMaker's own agent calls them: no key there
    assert config_of(spec, sagemaker=True).admin_keys is None


def test_the_container_runs_the_contract_when_sagemaker_asks(tmp_path, monkeypatch, tiny_artifact):
    """SAGEMAKER_MULTI_MODEL=true: a multi-model spec with the budget of the container's
    environment, and a deployment that starts with no model at all, not even the one
    baked into the image (SageMaker loads them through /models and lists only those),
    whose workers follow the catalog."""
    from neuronserve.platforms.sagemaker.entrypoint import sagemaker_deployment, sagemaker_spec

    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "true")
    monkeypatch.setenv("NEURONSERVE_MEMORY_BUDGET_MB", "512")
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("NEURONSERVE_BAKED_MODEL", str(tiny_artifact))
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "1")
    spec = sagemaker_spec(tmp_path / "work")
    assert spec.multi_model.enabled and spec.multi_model.memory_budget_mb == 512
    deployment = sagemaker_deployment(spec, tmp_path / "work")
    assert deployment.multi_model and deployment.initial == {} and deployment.packaged.models == []
    assert deployment.spec.multi_model.catalog_dir == tmp_path / "work" / "catalog"
    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "false")
    monkeypatch.setenv("NEURONSERVE_BAKED_MODEL", str(tmp_path / "none"))
    with pytest.raises(Exception, match="no model in"):
        sagemaker_deployment(sagemaker_spec(tmp_path / "work"), tmp_path / "work")


def test_an_idle_model_is_unloaded_and_loads_again_on_its_next_request(endpoint):
    client, models, serving, workers = endpoint
    load(client, "a", models / "a")
    serving.catalog.idle_unload_s = 0.3
    client.portal.call(serving.catalog.start)
    wait_for(
        lambda: client.get("/models/a").json()["state"] == "evicted" and not any(workers.held),
        10,
        what="the idle model unloaded",
    )
    assert embed(client, "a").status_code == 200
    assert client.get("/models/a").json()["state"] == "ready"


# The third security review's findings on the multi-model API: each test fails on the
# code before the fix.


def _wait_loading(client, name):
    wait_for(
        lambda: client.get(f"/models/{name}").json().get("state") == "loading",
        10,
        what="the load to start",
    )


def _wait_operations(serving, name: str, n: int) -> None:
    """Until `n` operations on `name` (register, swap, unregister) run or wait their turn."""
    wait_for(lambda: serving.catalog._names.get(name, (None, 0))[1] >= n, 10, what=f"{n} ops")


def _nothing_left(client, workers, catalog_dir):
    assert client.get("/models").json()["models"] == []
    assert client.get("/v1/models").json()["data"] == []
    assert client.get("/info").json()["models"] == []
    assert all(h == {} for h in workers.held)
    assert not any((catalog_dir / "sources").glob("*")), list((catalog_dir / "sources").glob("*"))


@pytest.mark.parametrize(
    "name",
    [
        "../../../../victim",
        "/abs/olute",
        "x" * 256,
        "é" * 200,
        "modèle",
        "a\r\nforged: line",
        "",
        "minilm\n",
    ],
)
def test_a_model_name_that_is_not_plain_is_refused_at_the_door(endpoint, tmp_path, name):
    client, models, serving, _ = endpoint
    victim = tmp_path / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "keep").write_text("keep me")
    r = load(client, name, models / "a")
    assert r.status_code == 400, r.text
    assert "not a plain name" in r.json()["error"] and "at most 128" in r.json()["error"]
    assert (victim / "keep").read_text() == "keep me"
    assert len(serving.table) == 0
    assert not (tmp_path / "abs").exists()


def test_names_in_the_path_follow_the_same_rule(endpoint):
    client, models, _, _ = endpoint
    assert load(client, "a", models / "a").status_code == 200
    for method in ("get", "delete"):
        r = getattr(client, method)("/models/mod%C3%A8le")
        assert r.status_code == 400 and "not a plain name" in r.json()["error"], r.text
    assert client.put("/models/mod%C3%A8le", json={"url": str(models / "b")}).status_code == 400
    assert client.post("/models/mod%C3%A8le/invoke", json={"inputs": "x"}).status_code == 400
    assert client.get("/models/a").status_code == 200


def test_a_relative_url_is_refused_with_what_to_send(endpoint):
    client, _, _, _ = endpoint
    r = load(client, "a", "models/a")
    assert r.status_code == 400 and "not an absolute path" in r.json()["error"], r.text


def test_delete_during_a_registration_waits_for_it_then_unloads_no_ghost(endpoint, tmp_path):
    client, models, serving, workers = endpoint
    workers.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        posted = pool.submit(load, client, "a", models / "a")
        _wait_loading(client, "a")
        deleted = pool.submit(client.delete, "/models/a")
        _wait_operations(serving, "a", 2)  # the DELETE came, and waits its turn
        assert not deleted.done()  # one name, one operation at a time, in order
        workers.gate.set()
        assert posted.result().status_code == 200
        assert deleted.result().status_code == 200, deleted.result().text
    _nothing_left(client, workers, tmp_path / "catalog")
    assert client.delete("/models/a").status_code == 404
    assert embed(client, "a").status_code == 404


def test_delete_during_a_load_on_demand_leaves_no_ghost(endpoint, tmp_path):
    client, models, serving, workers = endpoint
    assert load(client, "a", models / "a").status_code == 200
    entry = serving.table.get("a")
    client.portal.call(serving.catalog._evict, entry, "for the test")
    workers.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        asked = pool.submit(embed, client, "a")
        _wait_loading(client, "a")
        deleted = pool.submit(client.delete, "/models/a")
        wait_for(lambda: serving.table.get("a") is None, 10, what="the DELETE")
        workers.gate.set()
        assert deleted.result().status_code == 200
        assert asked.result().status_code == 404  # its model went while it waited
    _nothing_left(client, workers, tmp_path / "catalog")


def test_two_registrations_of_one_name_one_wins_the_other_is_409(endpoint):
    client, models, serving, workers = endpoint
    reading = threading.Event()
    read = serving.catalog._read

    def slow_read(*args):
        assert reading.wait(30)
        return read(*args)

    serving.catalog._read = slow_read
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(load, client, "a", models / "a")
        wait_for(lambda: "a" in serving.catalog._registering, 10, what="the first POST")
        second = pool.submit(load, client, "a", models / "b")
        wait_for(second.done, 10, what="the second POST's answer, while the first reads")
        reading.set()
        answers = sorted([first.result().status_code, second.result().status_code])
    assert answers == [200, 409], answers
    assert client.get("/models/a").json()["modelUrl"] == str(models / "a")
    assert all(set(h) == {"a"} for h in workers.held)


def test_a_swap_during_a_delete_and_a_delete_during_a_swap(endpoint, tmp_path):
    client, models, serving, workers = endpoint
    # a DELETE first (held by a request in flight): the PUT waits, then finds nothing
    assert load(client, "a", models / "a").status_code == 200
    held = serving.table.hold(serving.table.get("a"))
    with ThreadPoolExecutor(2) as pool:
        deleted = pool.submit(client.delete, "/models/a")
        _wait_operations(serving, "a", 1)
        swapped = pool.submit(client.put, "/models/a", json={"url": str(models / "cls")})
        _wait_operations(serving, "a", 2)
        client.portal.call(serving.release, {"neuronserve.model_held": held})
        assert deleted.result().status_code == 200
        assert swapped.result().status_code == 404
    _nothing_left(client, workers, tmp_path / "catalog")
    # a PUT first (a slow load): the DELETE waits for it, then unloads the new version
    assert load(client, "a", models / "a").status_code == 200
    workers.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        swapped = pool.submit(client.put, "/models/a", json={"url": str(models / "cls")})
        _wait_operations(serving, "a", 1)
        deleted = pool.submit(client.delete, "/models/a")
        _wait_operations(serving, "a", 2)
        workers.gate.set()
        assert swapped.result().status_code == 200
        assert deleted.result().status_code == 200
    _nothing_left(client, workers, tmp_path / "catalog")


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_an_archive_is_bounded_while_it_unpacks_and_nothing_is_left(
    endpoint, tmp_path, monkeypatch
):
    from neuronserve import sources as model_source

    client, _, _, workers = endpoint
    monkeypatch.setattr(model_source, "MIN_ROOM", 1 << 20, raising=False)
    monkeypatch.setattr(model_source, "MAX_MEMBERS", 50, raising=False)
    bomb = _tar(tmp_path / "bomb.tar.gz", {"weights.bin": b"\0" * (32 << 20)})
    assert bomb.stat().st_size < 100_000
    r = load(client, "bomb", bomb)
    assert r.status_code == 400 and "unpacks to more than 1 MiB" in r.json()["error"], r.text
    many = _tar(tmp_path / "many.tar.gz", {f"f{i}": b"" for i in range(100)})
    r = load(client, "many", many)
    assert r.status_code == 400 and "more than 50 files" in r.json()["error"], r.text
    _nothing_left(client, workers, tmp_path / "catalog")


def test_the_archives_of_one_url_share_one_bound(endpoint, tmp_path, monkeypatch):
    """A folder of several archives unpacks within the bound of their joint size, not
    each within its own (three archives would otherwise take three times the room)."""
    from neuronserve import sources as model_source

    client, _, _, workers = endpoint
    monkeypatch.setattr(model_source, "MIN_ROOM", 1 << 20, raising=False)
    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(3):
        _tar(folder / f"part{i}.tar.gz", {f"weights{i}.bin": b"\0" * (600 << 10)})
    r = load(client, "parts", folder)
    assert r.status_code == 400, r.text
    assert "part1.tar.gz (with those before it) unpacks to more than 1 MiB" in r.json()["error"]
    _nothing_left(client, workers, tmp_path / "catalog")


def test_a_failed_load_a_delete_and_a_swap_leave_no_files(endpoint, tmp_path, tiny_artifact):
    client, _, _, workers = endpoint
    sources = tmp_path / "catalog" / "sources"
    broken = _tar(tmp_path / "broken.tar.gz", {"manifest.json": b"{}"})
    assert load(client, "x", broken).status_code == 400
    packed = tmp_path / "a.tar.gz"
    with tarfile.open(packed, "w:gz") as t:
        for f in tiny_artifact.iterdir():
            t.add(f, arcname=f.name)
    assert load(client, "a", packed).status_code == 200
    assert [p.name for p in sources.iterdir()] == ["a@1"]
    assert client.put("/models/a", json={"url": str(packed)}).status_code == 200
    assert [p.name for p in sources.iterdir()] == ["a@2"]
    assert client.delete("/models/a").status_code == 200
    _nothing_left(client, workers, tmp_path / "catalog")


def test_errors_of_the_management_api_name_no_folder_of_the_host(endpoint, tmp_path):
    client, _, _, _ = endpoint
    broken = _tar(tmp_path / "broken.tar.gz", {"manifest.json": b"{}"})
    r = load(client, "x", broken)
    assert r.status_code == 400
    assert str(tmp_path / "catalog") not in r.text and "sources" not in r.text, r.text


def test_a_unicode_digit_in_max_results_is_a_400(endpoint):
    client, _, _, _ = endpoint
    for size in ("²", "٣", "0", "-1"):
        r = client.get("/models", params={"max_results": size})
        assert r.status_code == 400, (size, r.status_code)


def test_a_deleted_model_leaves_no_series_in_the_metrics(endpoint):
    client, models, _, _ = endpoint
    for name in ("gone", "kept"):
        assert load(client, name, models / "a").status_code == 200
        assert embed(client, name).status_code == 200
        assert client.post("/embed", json={"inputs": "x", "model": name}).status_code == 200
    metrics = client.get("/metrics").text
    assert 'model="gone"' in metrics and 'model="kept"' in metrics
    assert 'NeuronServeBatchRequests{ModelName="mme",Level="Model",model="gone"' in metrics
    assert client.delete("/models/gone").status_code == 200
    metrics = client.get("/metrics").text
    # the engine still counts it; the front passes none of its series on
    assert 'model="gone"' not in metrics, [m for m in metrics.splitlines() if "gone" in m]
    assert 'NeuronServeBatchRequests{ModelName="mme",Level="Model",model="kept"' in metrics
    # the old version of a swap goes the same way; a name registered again comes back
    assert client.put("/models/kept", json={"url": str(models / "b")}).status_code == 200
    assert embed(client, "kept").status_code == 200
    metrics = client.get("/metrics").text
    assert 'model="kept@2"' in metrics
    assert 'NeuronServeBatchRequests{ModelName="mme",Level="Model",model="kept"' not in metrics
    assert load(client, "gone", models / "a").status_code == 200
    assert 'Level="Model",model="gone"' in client.get("/metrics").text
