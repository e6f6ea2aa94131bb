"""text-embeddings-inference's further routes on a real server: `neuronserve serve
front` serving an embedder compiled with every token's
vector and sentence-transformers prompts, and a SPLADE model. Answers equal the models
run eagerly by transformers (a reference computed another way), every answer fits TEI's
own OpenAPI document, and the official openai client reads /v1/embeddings with a token-id
input. The routes' HTTP handling alone is tested in process (tests/unit)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openai
import psutil
import pytest
import requests
import torch
from helpers import free_port, run_cli, write_spec
from tei_document import PROMPTS, TEXTS, conforms

pytestmark = pytest.mark.server


class Front:
    def __init__(self, port: int, work: Path):
        self.url = f"http://127.0.0.1:{port}"
        self.work = work

    def processes(self) -> set[int]:
        """The front's process and everything under it: its workers."""
        pid = int((self.work / "front" / "front.pid").read_text())
        return {p.pid for p in psutil.Process(pid).children(recursive=True)} | {pid}

    def call(self, path: str, body, expect: int = 200):
        r = requests.post(f"{self.url}{path}", json=body, timeout=60)
        conforms(path, "POST", r)
        assert r.status_code == expect, (path, r.status_code, r.text[:300])
        return r.json()


@pytest.fixture(scope="module")
def front(tmp_path_factory, tei_models):
    work = tmp_path_factory.mktemp("tei")
    port = free_port()
    write_spec(work, front_port=port, front_run_dir="front", workers=2,
               max_answer_bytes=8 * 2**20)  # fmt: skip
    models = [tei_models["embedder"], tei_models["splade"]]
    run_cli("serve", "front", *models, "--spec", "deploy.yaml", cwd=work)
    yield Front(port, work)
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work)


def _eager(model_dir: Path, auto_class: str, text: str) -> torch.Tensor:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = getattr(transformers, auto_class).from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**tok(text, return_tensors="pt"))


def test_embed_all_is_every_tokens_hidden_state(front, tei_models):
    got = front.call("/embed_all", {"inputs": TEXTS, "prompt_name": "passage"})
    folder = tei_models["embedder"].parent / "embedder-model"
    for text, rows in zip(TEXTS, got, strict=True):
        want = _eager(folder, "AutoModel", PROMPTS["passage"] + text).last_hidden_state[0]
        np.testing.assert_allclose(np.array(rows), want.numpy(), atol=1e-4)
    front.call("/embed_all", {"inputs": "x", "model": "splade"}, 424)


def test_embed_sparse_is_the_splade_formula(front, tei_models):
    got = front.call("/embed_sparse", {"inputs": TEXTS, "model": "splade"})
    for text, terms in zip(TEXTS, got, strict=True):
        logits = _eager(tei_models["splade"].parent / "mlm", "AutoModelForMaskedLM", text).logits
        want = torch.log1p(torch.relu(logits[0])).amax(0).numpy()
        whole = np.zeros_like(want)
        whole[[t["index"] for t in terms]] = [t["value"] for t in terms]
        np.testing.assert_allclose(whole, want, atol=1e-4)
    front.call("/embed_sparse", {"inputs": "x", "model": "embedder"}, 424)


def test_prompts_similarity_and_token_ids(front):
    plain = front.call("/embed", {"inputs": ["query: " + TEXTS[0]], "model": "embedder"})
    named = front.call("/embed", {"inputs": [TEXTS[0]], "model": "embedder",
                                  "prompt_name": "query"})  # fmt: skip
    np.testing.assert_allclose(named, plain, atol=1e-6)
    front.call("/embed", {"inputs": "x", "model": "embedder", "prompt_name": "title"}, 422)
    vectors = np.array(front.call("/embed", {"inputs": TEXTS, "model": "embedder"}))
    pair = {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}
    got = front.call("/similarity", {"inputs": pair, "model": "embedder"})
    np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=1e-5)
    tokens = requests.post(f"{front.url}/tokenize", json={"inputs": TEXTS[1], "model": "embedder"},
                           timeout=60).json()[0]  # fmt: skip
    ids = [t["id"] for t in tokens]
    assert front.call("/decode", {"ids": ids, "model": "embedder"}) == [TEXTS[1].lower()]
    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0)
    by_ids = client.embeddings.create(model="embedder", input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, vectors[1], atol=1e-6)
    assert by_ids.usage.prompt_tokens == len(ids)


def test_info_names_each_models_type(front):
    info = requests.get(f"{front.url}/info", timeout=60)
    conforms("/info", "GET", info)
    types = {m["model_id"]: m["model_type"] for m in info.json()["models"]}
    assert types == {"embedder": {"embedding": {"pooling": "mean"}},
                     "splade": {"embedding": {"pooling": "splade"}}}  # fmt: skip
    prompts = {m["model_id"]: m["prompts"] for m in info.json()["models"]}
    assert prompts == {"embedder": PROMPTS, "splade": {}}
    assert json.loads(info.text)["max_input_length"] == 32


def test_an_answer_too_large_to_carry_is_refused_and_no_worker_dies(front):
    """Every token's vector of many long texts, an answer over max_answer_bytes: refused
    with the limit named, with every process still the one it was; the next request is
    answered."""
    before = front.processes()
    long = "word " * 40
    # 1024 texts x 32 tokens x 32 numbers: about 16 MiB of JSON, over the 8 MiB allowed
    body = {"inputs": [long] * 1024, "model": "embedder", "truncate": True}
    refused = front.call("/embed_all", body, 422)
    assert "max_answer_bytes" in refused["error"]
    # what the tokens cannot foretell (a SPLADE model's terms), the worker bounds as
    # written: this random model weighs most of its 30,522 terms, ~0.7 MB a text
    sparse = front.call("/embed_sparse", {"inputs": ["x"] * 16, "model": "splade"}, 422)
    assert "max_answer_bytes" in sparse["error"]
    assert front.call("/embed_all", {"inputs": [long] * 2, "model": "embedder",
                                     "truncate": True})  # fmt: skip
    assert front.processes() == before
    health = requests.get(f"{front.url}/health", timeout=10).json()
    assert health["status"] == "ok", health
