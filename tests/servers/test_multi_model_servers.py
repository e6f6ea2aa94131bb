"""SageMaker's multi-model contract through a real front, on CPU and on a fake
4-NeuronCore host with the stand-in SDK (there a model can only be loaded by the worker
process that holds the cores). A budget of two models, three registered: requests
cycling through all three answer right while the least recently used is evicted and
loaded again on demand; 409, delete then 404, pagination, a swap under 16 clients with
no failed request, and a killed worker replaced with every model while no request
fails. The catalog's own logic (507, the admin key, eviction order) is tested in
process: tests/unit/test_multi_model.py."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from helpers import (
    counter_total,
    free_port,
    run_cli,
    standin_env,
    standin_events,
    wait_for,
    wait_for_more,
    write_spec,
)

from neuronserve import catalog, placement
from neuronserve.artifact import read_manifest

pytestmark = pytest.mark.server


class Endpoint:
    def __init__(self, work: Path, port: int, env: dict, models: Path):
        self.work, self.url, self.env, self.models = work, f"http://127.0.0.1:{port}", env, models
        self.admin = {
            "Authorization": f"Bearer {(work / 'front' / 'admin_key').read_text().strip()}"
        }

    def load(self, name: str, folder: str | None = None) -> requests.Response:
        url = str(self.models / (folder or name))
        return requests.post(
            f"{self.url}/models",
            json={"model_name": name, "url": url},
            headers=self.admin,
            timeout=120,
        )

    def invoke(self, name: str, text: str = "hello") -> requests.Response:
        return requests.post(f"{self.url}/models/{name}/invoke", json={"inputs": text}, timeout=120)

    def listed(self, **params) -> dict:
        return requests.get(
            f"{self.url}/models", params=params, headers=self.admin, timeout=30
        ).json()


def close(got, want, tol: float = 1e-4) -> bool:
    """Equal answers, numbers within `tol` (a batch's composition moves the last digits)."""
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return abs(got - want) <= tol
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(
            close(g, w, tol) for g, w in zip(got, want, strict=True)
        )
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k], tol) for k in got)
    return got == want


# the host: the CPU, or a fake 4-NeuronCore host with the stand-in SDK
HOSTS = ["cpu", "neuron"]


@pytest.fixture(scope="module", params=HOSTS)
def endpoint(request, tmp_path_factory, tiny_artifact, classifier_artifact, neuronx_artifact):
    host = request.param
    neuron = host == "neuron"
    work = tmp_path_factory.mktemp(f"multi-{host}")
    models = work / "models"
    embedder = neuronx_artifact if neuron else tiny_artifact
    for name in ("a", "b", "c"):
        shutil.copytree(embedder, models / name)
    if not neuron:
        shutil.copytree(classifier_artifact, models / "cls")
    manifest = read_manifest(models / "a")
    cost = placement.model_memory("a", manifest, models / "a", "neuron" if neuron else "cpu")
    env = {k: v for k, v in os.environ.items() if k != "NEURONSERVE_ADMIN_KEY"}
    if neuron:
        env.update(standin_env(4, log=work / "standin.jsonl", devices=work / "devices"))
        env["NEURONSERVE_LEASE_DIR"] = str(work / "leases")
    port = free_port()
    write_spec(
        work,
        front_port=port,
        front_run_dir="front",
        multi_model=True,
        memory_budget_mb=2.5 * cost.total / 2**20,
        workers=2,
        target=manifest.target,
    )
    out = run_cli("serve", "front", "--spec", "deploy.yaml", cwd=work, env=env)
    assert "multi-model, 0 model(s) loaded" in out.stdout, out.stdout
    yield Endpoint(work, port, env, models)
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work, env=env)


def test_three_models_on_a_budget_of_two_answer_and_evictions_are_counted(endpoint):
    for name in "ab":
        r = endpoint.load(name)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "ready"
    want = endpoint.invoke("a").json()
    assert endpoint.load("c").status_code == 200  # b, the least recently used, goes
    states = {m["modelName"]: m["state"] for m in endpoint.listed()["models"]}
    assert states == {"a": "ready", "b": "evicted", "c": "ready"}
    for name in "bcabca":
        r = endpoint.invoke(name)
        assert r.status_code == 200, r.text
        # three copies of one artifact: the same answer from each
        assert close(r.json(), want)
    metrics = requests.get(f"{endpoint.url}/metrics", timeout=30).text
    evictions = counter_total(metrics, "neuronserve_model_evictions_total")
    assert evictions >= 5
    assert 'neuronserve_model_waited_requests_total{model="b"}' in metrics
    assert 'neuronserve_model_load_seconds_total{model="a"}' in metrics


def test_409_then_delete_then_404_and_pages(endpoint):
    again = endpoint.load("a", "b")
    assert again.status_code == 409, again.text
    page = endpoint.listed(max_results=2)
    assert [m["modelName"] for m in page["models"]] == ["a", "b"]
    rest = endpoint.listed(max_results=2, next_page_token=page["nextPageToken"])
    assert [m["modelName"] for m in rest["models"]] == ["c"] and "nextPageToken" not in rest
    one = requests.get(f"{endpoint.url}/models/c", headers=endpoint.admin, timeout=30).json()
    assert one["modelName"] == "c" and one["modelUrl"] == str(endpoint.models / "c")
    r = requests.delete(f"{endpoint.url}/models/c", headers=endpoint.admin, timeout=60)
    assert r.status_code == 200, r.text
    gone = endpoint.invoke("c")
    assert gone.status_code == 404, gone.text
    assert endpoint.invoke("a").status_code == 200
    assert requests.get(f"{endpoint.url}/models", timeout=30).status_code == 401  # no admin key


def test_a_swap_under_16_clients_fails_no_request(endpoint):
    """`a` moves to another artifact (the classifier; on Neuron a copy of the same one)
    while 16 clients send to it: every request answers 200."""
    target = "cls" if (endpoint.models / "cls").exists() else "b"
    before = endpoint.invoke("a", "fine").json()
    after_model = endpoint.load("probe", target)
    assert after_model.status_code == 200, after_model.text
    after = endpoint.invoke("probe", "fine").json()
    requests.delete(f"{endpoint.url}/models/probe", headers=endpoint.admin, timeout=60)
    stop = threading.Event()
    statuses: list[int] = []
    bodies: list = []

    def hammer():
        with requests.Session() as s:
            while not stop.is_set():
                r = s.post(f"{endpoint.url}/models/a/invoke", json={"inputs": "fine"}, timeout=120)
                statuses.append(r.status_code)
                bodies.append(r.json())

    with ThreadPoolExecutor(16) as pool:
        for _ in range(16):
            pool.submit(hammer)
        wait_for_more(statuses, 32)  # traffic flowing before the swap
        swapped = requests.put(
            f"{endpoint.url}/models/a",
            json={"url": str(endpoint.models / target)},
            headers=endpoint.admin,
            timeout=120,
        )
        wait_for_more(statuses, 32)  # and after it
        stop.set()
    assert swapped.status_code == 200, swapped.text
    assert len(statuses) > 32
    assert set(statuses) == {200}, [s for s in statuses if s != 200][:5]
    assert all(close(b, before) or close(b, after) for b in bodies)
    assert close(bodies[-1], after)  # once swapped, the new model answers
    if target == "b":
        # on the stand-in, every load went to the loading worker's own NeuronCores
        loads = standin_events(endpoint.work / "standin.jsonl", "load")
        assert loads and len({(e["pid"], e["core"]) for e in loads}) == len(
            {e["core"] for e in loads}
        )


def test_a_killed_worker_comes_back_with_every_model_and_no_request_fails(endpoint):
    """Last: kill the worker of core group 0 while 8 clients call every loaded model
    through the front: each request is answered 200 (the other worker serves, the front
    sends a request whose worker died once more), and the replacement, on the same core
    group, holds every model the catalog holds."""
    [folder] = [p.parent for p in endpoint.work.glob("**/catalog/wanted.json")]
    before = {s["group"]: s for s in catalog.worker_states(folder)}
    held = sorted(before[0]["models"])  # the workers' names: a swapped model's "a@2"
    assert held and all(v == catalog.READY for v in before[0]["models"].values())
    loaded = [m["modelName"] for m in endpoint.listed()["models"] if m["state"] == "ready"]
    assert len(loaded) == len(held)
    stop = threading.Event()
    statuses: list[int] = []

    def hammer(i: int):
        with requests.Session() as s:
            while not stop.is_set():
                name = loaded[i % len(loaded)]
                url = f"{endpoint.url}/models/{name}/invoke"
                r = s.post(url, json={"inputs": "x"}, timeout=120)
                statuses.append(r.status_code)
                i += 1

    with ThreadPoolExecutor(8) as pool:
        for i in range(8):
            pool.submit(hammer, i)
        wait_for_more(statuses, 16)
        os.kill(before[0]["pid"], signal.SIGKILL)

        def replaced():
            now = {s["group"]: s for s in catalog.worker_states(folder)}
            new = now.get(0)
            return new if new and new["pid"] != before[0]["pid"] else None

        new = wait_for(replaced, timeout=60, what="a replacement on core group 0")
        wait_for(
            lambda: all(sorted(w["models"]) == held for w in catalog.worker_states(folder)),
            timeout=60,
            what="the replacement's models",
        )
        wait_for_more(statuses, 16)
        stop.set()
    assert new["models"] == before[0]["models"]
    assert set(statuses) == {200}, [s for s in statuses if s != 200][:5]
