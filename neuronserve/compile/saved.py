"""What every artifact keeps beside its modules, however they were made (compiled here,
or imported from optimum-neuron): the tokenizer, with padding and truncation off, and the
versions of the libraries that made it."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from .base import CompileError


def save_tokenizer(model_dir: Path, out: Path) -> dict[str, Any]:
    """Write the fast tokenizer as tokenizer.json with padding and truncation off
    (the grid decides both at serve time); return what the manifest's tokenizer settings
    record of it (pad, mask and unknown token ids, how transformers cleans decoded text)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # any loader failure means the same to the user
        raise CompileError(f"cannot load a tokenizer from {model_dir}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise CompileError(
            f"{model_dir} has no fast (Rust) tokenizer; neuronserve tokenizes whole batches "
            "with `tokenizers`. Save one with tokenizer.save_pretrained() from a fast tokenizer."
        )
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(out / "tokenizer.json"))
    # transformers' decode skips its clean-up for BPE models unless told otherwise
    bpe = type(backend.model).__name__ == "BPE" and not getattr(
        tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
    )
    return {
        "pad_token_id": int(tok.pad_token_id if tok.pad_token_id is not None else 0),
        "mask_token_id": tok.mask_token_id,
        "unk_token_id": tok.unk_token_id,
        "clean_up_spaces": bool(getattr(tok, "clean_up_tokenization_spaces", False)) and not bpe,
    }


def versions() -> dict[str, str]:
    """What the manifest records of the libraries that made an artifact."""
    import tokenizers
    import transformers

    return {
        "neuronserve": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }
