"""Each request is held to the rules of the route whose handler runs, and what clients
send never grows the front (the fifth security review's findings on the guard): the
series' labels are the route table's templates, not the paths clients send; a route is
its template and its method, so POST /models keeps the load's deadline beside GET
/models, and a path holding a template's own text (`/models/%7Bname%7D`) selects no
route; an open route reached without a key names no served model. Each test fails on
the code before the fix."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

import pytest
from in_process_front import front
from starlette.responses import Response

from neuronserve.runtime import Runner
from neuronserve.serve.front.keys import Keys
from neuronserve.serve.front.routes import Api, endpoints

API, ADMIN = b"api-key", b"admin-key"


@pytest.fixture(scope="module")
def runners(tei_models):
    return {"embedder": Runner(tei_models["embedder"])}


def _keyed(client):
    """The front asking for keys, as one on a public address does."""
    guard = client.app
    guard.config = dataclasses.replace(
        guard.config, keys=Keys((API,), "test"), admin_keys=Keys((ADMIN,), "test")
    )
    return client


def _series(text: str) -> set[tuple[str, str]]:
    """Every (route, model) the front's request counter holds."""
    found = set()
    for labels in re.findall(r"^neuronserve_front_requests_total\{(.*)\} \S+$", text, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found.add((pairs["route"], pairs["model"]))
    return found


def _lines(text: str) -> int:
    return sum(line.startswith("neuronserve_front_") for line in text.splitlines())


def test_the_fronts_series_are_bounded_by_the_route_table(tmp_path, runners):
    """Without a key, distinct paths on the open templated routes: the series hold their
    templates, however many paths were sent, and /metrics does not grow with them."""
    client, _, _ = front(tmp_path, runners)
    _keyed(client)
    auth = {"Authorization": f"Bearer {API.decode()}"}

    def scrape() -> str:
        r = client.get("/metrics", headers=auth)
        assert r.status_code == 200
        return r.text

    for i in range(5):
        client.get(f"/models/m{i}/health")
        client.get(f"/docs/f{i}.js")
        client.get(f"/nowhere/{i}")
    scrape()  # the scrape's own series, before the count
    before = _lines(scrape())
    for i in range(5, 60):
        client.get(f"/models/m{i}/health")
        client.get(f"/docs/f{i}.js")
        client.get(f"/nowhere/{i}")
    text = scrape()
    templates = {e.path for e in endpoints(Api(None, None))} | {"unmatched"}  # type: ignore[arg-type]
    routes = {route for route, _ in _series(text)}
    assert routes <= templates, routes - templates
    assert {"/models/{name}/health", "/docs/{name}"} <= routes
    assert {model for _, model in _series(text)} <= {"", "embedder"}
    assert _lines(text) == before  # not one series per path sent


def test_a_route_is_its_template_and_its_method(tmp_path, runners, monkeypatch):
    """POST /models (a load) is held to the load's deadline, GET /models to deadline_s:
    both handlers take longer than deadline_s, only the load is answered."""

    async def slow(api, request):
        await asyncio.sleep(0.6)
        return Response(b"{}", media_type="application/json")

    monkeypatch.setattr(Api, "load_model", slow)
    monkeypatch.setattr(Api, "list_models", slow)
    client, _, _ = front(tmp_path, runners, deadline_s=0.2)
    _keyed(client)
    admin = {"Authorization": f"Bearer {ADMIN.decode()}"}
    loaded = client.post("/models", json={"model_name": "x", "url": "/nowhere"}, headers=admin)
    assert loaded.status_code == 200, loaded.text
    listed = client.get("/models", headers=admin)
    assert listed.status_code == 504, listed.text


def test_a_templates_own_text_selects_no_route(tmp_path, runners, caplog, monkeypatch):
    """`DELETE /models/%7Bname%7D` with the API key reaches no handler (it reached the
    admin unload before); `GET /models/%7Bname%7D/health` is no open route and logs no
    traceback; a real name at the same template still reaches its handler."""
    unloads: list[str] = []

    async def unload(api, request):
        unloads.append(request.path_params["name"])
        return Response(b"{}", media_type="application/json")

    monkeypatch.setattr(Api, "unload_model", unload)
    client, _, _ = front(tmp_path, runners)
    _keyed(client)
    api = {"Authorization": f"Bearer {API.decode()}"}
    admin = {"Authorization": f"Bearer {ADMIN.decode()}"}
    caplog.set_level(logging.ERROR, "neuronserve.front")
    for headers in (api, admin):
        r = client.delete("/models/%7Bname%7D", headers=headers)
        assert r.status_code in (401, 404), r.text
    health = client.get("/models/%7Bname%7D/health")  # no route: a key, then a 404
    assert health.status_code == 401, health.text
    assert client.get("/models/%7Bname%7D/health", headers=api).status_code == 404
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert unloads == []
    # the API key is not the admin key, and a real name is unloaded with the admin's
    assert client.delete("/models/embedder", headers=api).status_code == 401
    assert client.delete("/models/embedder", headers=admin).status_code == 200
    assert unloads == ["embedder"]


def test_an_open_route_names_no_served_model(tmp_path, runners):
    """The per-model health, open without a key: a wrong name is a 404 that lists no
    model; the served model's is answered."""
    client, _, _ = front(tmp_path, runners)
    _keyed(client)
    wrong = client.get("/models/nope/health")
    assert wrong.status_code == 404, wrong.text
    assert "embedder" not in wrong.text
    assert client.get("/models/embedder/health").status_code == 200
