"""The front's pieces that need no server: where keys come from and how they are checked,
text-embeddings-inference's input rule, error shapes, request validation, the OpenAPI
document, the engine settings a spec passes on, and the task changes the routes rely on
(per-request truncation, sigmoid for one-label models)."""

from __future__ import annotations

import os
import stat

import numpy as np
import orjson
import pytest
from in_process_front import config_of

from neuronserve.serve.deployment import Deployment, model_entries
from neuronserve.serve.front import schemas
from neuronserve.serve.front.errors import error_body, family_of
from neuronserve.serve.front.keys import (
    ENV_KEY,
    GENERATED_KEY_FILE,
    KeyFileError,
    Keys,
    resolve_keys,
)
from neuronserve.serve.front.openapi import document
from neuronserve.serve.front.routes import Api, endpoints, predict_inputs
from neuronserve.serve.model_source import FoundModel
from neuronserve.spec import ModelEntry, load_spec
from neuronserve.tasks import RequestError, get_task


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv(ENV_KEY, raising=False)


def spec(tmp_path, **fields):
    return load_spec(None, {"front_run_dir": tmp_path / "front", **fields})


def test_keys_are_off_on_loopback_and_generated_beyond_it(tmp_path, no_env_key):
    assert resolve_keys(spec(tmp_path).front) is None
    assert resolve_keys(spec(tmp_path, front_address="::1").front) is None
    keys = resolve_keys(spec(tmp_path, front_address="0.0.0.0").front)
    path = tmp_path / "front" / GENERATED_KEY_FILE
    assert keys is not None and keys.where == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(keys.values[0]) >= 40 and path.read_text().strip().encode() == keys.values[0]
    again = resolve_keys(spec(tmp_path, front_address="10.0.0.5").front)
    assert again is not None and again.values == keys.values  # kept, not replaced
    assert resolve_keys(spec(tmp_path, front_address="0.0.0.0", auth="off").front) is None
    assert resolve_keys(spec(tmp_path, front_address="0.0.0.0").front, sagemaker=True) is None


def test_keys_given_are_used_even_on_loopback(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_KEY, "from-env")
    keys = resolve_keys(spec(tmp_path).front)
    assert keys is not None and keys.values == (b"from-env",) and keys.where == f"${ENV_KEY}"
    monkeypatch.delenv(ENV_KEY)
    f = tmp_path / "keys"
    f.write_text("# comment\n\n k1 \nk2\n")
    f.chmod(0o600)
    keys = resolve_keys(spec(tmp_path, api_key_file=f, auth="on").front)
    assert keys is not None and keys.values == (b"k1", b"k2")


def test_key_files_others_can_write_or_that_hold_nothing_are_refused(tmp_path, no_env_key):
    f = tmp_path / "keys"
    f.write_text("k\n")
    f.chmod(0o622)
    with pytest.raises(KeyFileError, match="writable by other users"):
        resolve_keys(spec(tmp_path, api_key_file=f).front)
    f.chmod(0o600)
    f.write_text("# nothing\n")
    with pytest.raises(KeyFileError, match="holds no key"):
        resolve_keys(spec(tmp_path, api_key_file=f).front)
    with pytest.raises(KeyFileError, match="cannot be read"):
        resolve_keys(spec(tmp_path, api_key_file=tmp_path / "missing").front)


def test_a_generated_key_is_never_written_through_a_symlink(tmp_path, no_env_key):
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (tmp_path / "front").mkdir(mode=0o700)
    os.symlink(target, tmp_path / "front" / GENERATED_KEY_FILE)
    with pytest.raises(KeyFileError, match="a symlink"):
        resolve_keys(spec(tmp_path, front_address="0.0.0.0").front)
    assert target.read_text() == "precious\n"


def test_bearer_check():
    keys = Keys((b"alpha", b"beta"), "test")
    assert keys.accepts(b"Bearer alpha") and keys.accepts(b"bearer beta")
    assert not keys.accepts(b"Bearer alph") and not keys.accepts(b"Bearer alphaX")
    assert not keys.accepts(b"Basic alpha") and not keys.accepts(b"alpha")
    assert not keys.accepts(None) and not keys.accepts(b"")


def test_tei_input_rule():
    assert predict_inputs("a") == (["a"], True)
    assert predict_inputs(["q", "d"]) == ([{"text": "q", "text_pair": "d"}], True)
    assert predict_inputs(["a"]) == (["a"], False)
    assert predict_inputs(["a", "b", "c"]) == (["a", "b", "c"], False)
    items, single = predict_inputs([["q", "d"], "x"])
    assert items == [{"text": "q", "text_pair": "d"}, "x"] and not single
    with pytest.raises(RequestError, match="inputs\\[0\\] must be a text or a pair"):
        predict_inputs([["a", "b", "c"]])
    with pytest.raises(RequestError, match="empty"):
        predict_inputs([])


def test_error_shapes_follow_the_route_family():
    assert family_of("/v1/embeddings") == "openai" and family_of("/embed") == "tei"
    assert family_of("/invocations") == "native" and family_of("/elsewhere") == "native"
    openai = orjson.loads(error_body("openai", 401, "no"))["error"]
    assert openai == {
        "message": "no",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert orjson.loads(error_body("tei", 429, "busy")) == {
        "error": "busy",
        "error_type": "Overloaded",
    }
    assert orjson.loads(error_body("tei", 413, "big"))["error_type"] == "Validation"
    assert orjson.loads(error_body("native", 400, "bad")) == {"code": 400, "error": "bad"}


def test_request_bodies_are_strict_and_errors_name_the_field():
    def message(body: bytes, model=schemas.EmbedRequest) -> str:
        with pytest.raises(RequestError) as e:
            schemas.parse_body(body, model)
        return e.value.message

    assert message(b'{"inputs": "x", "truncate": "yes"}').startswith("truncate:")
    assert message(b'{"inputs": [1.5]}').startswith("inputs")
    assert "pooling" in message(b'{"inputs": "x", "pooling": "cls"}')
    assert "not valid JSON" in message(b'{"inputs": ')
    assert "empty" in message(b"")
    assert "dimensions" in message(b'{"inputs": "x", "dimensions": 0}')
    deep = b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert message(deep)  # nesting is bounded by the parser: a 400, not a crash
    ok = schemas.parse_body(
        b'{"inputs": "x", "truncate": true, "truncation_direction": "Left"}', schemas.EmbedRequest
    )
    assert ok.parameters() == {"truncate": True, "truncation_direction": "left"}


def test_openapi_document_covers_every_route_and_every_reference_resolves(tmp_path):
    table = endpoints(Api.__new__(Api))
    doc = document(table)
    assert set(doc["paths"]) == {e.path for e in table}
    refs = []

    def walk(node):
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    names = set(doc["components"]["schemas"])
    assert refs and all(r.rsplit("/", 1)[-1] in names for r in refs)
    probes = {p for p, ops in doc["paths"].items() if "security" not in next(iter(ops.values()))}
    assert probes == {
        "/health", "/ping", "/openapi.json", "/docs", "/docs/{name}", "/models/{name}/health"
    }  # fmt: skip
    assert all("security" not in op for ops in document(table, False)["paths"].values()
               for op in ops.values())  # fmt: skip


def test_what_reaches_the_workers_is_the_specs_worker_sections_not_the_fronts(
    tmp_path, tiny_artifact
):
    given = load_spec(
        None,
        {
            "worker": {"workers": 1},
            "truncation": False,
            "limits": {"max_text_chars": 20},
            "front": {"port": 9, "auth": "on"},
        },
    )
    deployment = Deployment(given, [ModelEntry(artifact=tiny_artifact)], tmp_path / "work")
    behind = deployment.spec
    assert (behind.worker.workers, behind.truncation, behind.limits.max_text_chars) == (
        1,
        False,
        20,
    )
    # the front's own settings (port, auth) stay with the front
    assert "port" not in behind.front.model_fields_set and behind.front.auth == "auto"
    # where the workers keep their store and sockets is the deployment's
    assert deployment.store == tmp_path / "work" / "store"
    assert deployment.run_dir == tmp_path / "work" / "run"
    # a model's packaged truncation is kept, unless the deployment gives one itself
    found = [FoundModel(tmp_path / "a", "a", truncation=True)]
    assert model_entries(found, load_spec(None, {}))[0].truncation is True
    assert model_entries(found, given)[0].truncation is None  # the deployment's False applies


def test_front_url(tmp_path):
    base = {"front_run_dir": tmp_path, "auth": "off"}
    assert config_of(load_spec(None, base)).url == "http://127.0.0.1:3000"
    wide = config_of(load_spec(None, {**base, "front_address": "0.0.0.0"}))
    assert wide.url == "http://127.0.0.1:3000"
    v6 = config_of(load_spec(None, {**base, "front_address": "::1", "front_port": 9}))
    assert v6.url == "http://[::1]:9"
    with pytest.raises(ValueError, match="both tls_cert and tls_key"):
        load_spec(None, {**base, "tls_cert": tmp_path / "c.pem"})


def test_one_label_models_score_with_sigmoid_like_the_pipeline():
    task = get_task("text-classification")
    logits = np.array([[2.0], [-1.0]])
    request = task.parse(["a", "b"], {})
    got = task.respond(logits, request, {"labels": ["LABEL_0"]})
    assert [r[0]["score"] for r in got] == pytest.approx(1 / (1 + np.exp(-logits[:, 0])))
    raw = task.respond(logits, task.parse(["a", "b"], {"function_to_apply": "none"}),
                       {"labels": ["LABEL_0"]})  # fmt: skip
    assert [r[0]["score"] for r in raw] == [2.0, -1.0]
    three = task.respond(np.array([[0.0, 1.0, 2.0]]), task.parse("a", {"top_k": None}),
                         {"labels": ["x", "y", "z"]})  # fmt: skip
    assert sum(r["score"] for r in three) == pytest.approx(1.0)  # softmax for several
    with pytest.raises(RequestError, match="function_to_apply"):
        task.parse("a", {"function_to_apply": "relu"})


def test_truncation_parameters_are_every_tasks():
    for name in ("feature-extraction", "text-classification"):
        r = get_task(name).parse("a", {"truncate": True, "truncation_direction": "LEFT"})
        assert (r.truncate, r.truncation_direction) == (True, "left")
        assert get_task(name).parse("a", {}).truncate is None
        with pytest.raises(RequestError, match="truncation_direction"):
            get_task(name).parse("a", {"truncation_direction": "middle"})
        with pytest.raises(RequestError, match='"truncate" must be'):
            get_task(name).parse("a", {"truncate": 1})


class _Client:
    def __init__(self, name: str, closed: list[str]) -> None:
        self.name, self.closed = name, closed

    async def close(self) -> None:
        self.closed.append(self.name)


class _Deployment:
    """What `_keep_whole` uses of a Deployment: whether it is stuck, restart, client."""

    tasks = "m (feature-extraction)"

    def __init__(self, serving) -> None:

        self.serving, self.why, self.restarts = serving, None, []
        self.closed: list[str] = []
        self.unreadable = True  # the workers' state cannot be read at first
        self.once = True
        self.asked = 0

    def stuck(self) -> str | None:
        self.asked += 1
        if self.unreadable:
            self.unreadable = False
            raise OSError("supervisor.pid: unreadable")
        if self.once:  # a word said once only is not acted on
            self.once = False
            return "m: wedged, once"
        return self.why

    def restart(self) -> None:
        self.restarts.append(self.serving.starting)
        self.why = None

    def client(self) -> _Client:
        return _Client(f"after {len(self.restarts)} restart(s)", self.closed)


def test_workers_only_a_restart_can_mend_are_restarted_and_health_says_loading():
    """`_keep_whole` asks the deployment whether it is stuck; when it says so twice running,
    /health's `starting` is on for the restart's time, and a restart waits for the lock
    the last stop holds."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from neuronserve.serve.front.server import _keep_whole

    config = SimpleNamespace(max_in_flight=8)
    serving = SimpleNamespace(starting=False, client=None, config=config)
    deployment, lock = _Deployment(serving), threading.Lock()
    serving.client = _Client("first", deployment.closed)
    seen = deployment.restarts

    async def until(condition, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        task = asyncio.create_task(_keep_whole(serving, deployment, lock, every_s=0.01))
        await until(lambda: deployment.asked > 3, "asked past the unreadable and lone words")
        # unreadable once, stuck once, then whole: never restarted
        assert seen == [] and not task.done()
        lock.acquire()  # the last stop holds it
        deployment.why = "m: wedged"
        await until(lambda: serving.starting, "/health turned to loading")
        assert seen == []  # waiting for the lock, /health 503
        lock.release()
        await until(lambda: seen and not serving.starting, "restarted and serving again")
        task.cancel()

    asyncio.run(scenario())
    assert seen == [True] and not serving.starting
    # the new workers' client (their sockets are new), the old one closed
    assert serving.client.name == "after 1 restart(s)"
    assert deployment.closed == ["first"]
