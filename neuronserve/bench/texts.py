"""Request texts with an exact token count, made of real vocabulary."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

WORDS = [
    "the", "model", "serves", "requests", "quickly", "while", "the", "server", "batches",
    "them", "and", "every", "worker", "keeps", "its", "own", "cores", "busy", "with", "real",
    "text", "from", "ordinary", "sentences",
]  # fmt: skip


def text_with_tokens(tokenizer_file: Path, n_tokens: int) -> str:
    """A text that tokenizes to exactly `n_tokens` tokens, special tokens included.

    Words are added one at a time, so the result is ordinary vocabulary; a word that
    would overshoot is swapped for the next one in the list that fits.
    """
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_truncation()
    tok.no_padding()
    base = len(tok.encode("").ids)  # [CLS] [SEP] and the like
    if n_tokens < base:
        raise ValueError(f"{n_tokens} tokens is fewer than the {base} special tokens")
    words: list[str] = []
    i = 0
    while len(tok.encode(" ".join(words)).ids) < n_tokens:
        for k in range(len(WORDS)):
            candidate = [*words, WORDS[(i + k) % len(WORDS)]]
            if len(tok.encode(" ".join(candidate)).ids) <= n_tokens:
                words = candidate
                i += k + 1
                break
        else:
            raise ValueError(f"cannot reach exactly {n_tokens} tokens with the word list")
    return " ".join(words)
