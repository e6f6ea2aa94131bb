"""Batch tokenization through the Rust `tokenizers` library.

Whole batches go through `encode_batch` in one call (the `transformers` wrapper costs
~10 ms per padded batch of 32 on these CPUs; the Rust call a fraction of that).
Padding is not done here: the bucket grid decides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from .tasks.base import Text


@dataclass
class Encoded:
    ids: list[int]
    attention_mask: list[int]
    type_ids: list[int]
    # tokens before any truncation: tells whether truncation dropped text
    full_length: int

    def row(self) -> dict[str, list[int]]:
        return {
            "input_ids": self.ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.type_ids,
        }


class TextTokenizer:
    def __init__(self, path: Path, max_length: int, data: str | None = None):
        """`data`: the tokenizer's JSON, when the caller read (and verified) it already;
        every tokenizer made here is built from those same bytes."""
        self.max_length = max_length
        self._json = data if data is not None else Path(path).read_text()
        self._full = Tokenizer.from_str(self._json)
        self._full.no_padding()
        self._full.no_truncation()
        self._path = path
        self._truncating: dict[str, Tokenizer] = {}

    def _cutting(self, direction: str) -> Tokenizer:
        # made on first use: most deployments never cut from the left
        if direction not in self._truncating:
            tok = Tokenizer.from_str(self._json)
            tok.no_padding()
            tok.enable_truncation(self.max_length, direction=direction)
            self._truncating[direction] = tok
        return self._truncating[direction]

    def encode(
        self, texts: Sequence[Text], truncate: bool, direction: str = "right"
    ) -> list[Encoded]:
        """Encode without truncation; re-encode only the over-long texts when allowed,
        keeping the first (`direction` right) or the last (left) `max_length` tokens.

        Texts over `max_length` keep their full ids when `truncate` is False so the
        caller can refuse them with their real length.
        """
        if not texts:
            return []
        batch = self._full.encode_batch(list(texts))
        out = [Encoded(e.ids, e.attention_mask, e.type_ids, len(e.ids)) for e in batch]
        if truncate:
            long_idx = [i for i, e in enumerate(out) if e.full_length > self.max_length]
            if long_idx:
                again = self._cutting(direction).encode_batch([texts[i] for i in long_idx])
                for i, e in zip(long_idx, again, strict=True):
                    out[i] = Encoded(e.ids, e.attention_mask, e.type_ids, out[i].full_length)
        return out

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[dict]]:
        """Each text's tokens as text-embeddings-inference's /tokenize lists them: id, the
        text it covers (the token itself for special tokens) and its character offsets."""
        batch = self._full.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out = []
        for text, e in zip(texts, batch, strict=True):
            row = []
            for tid, tok, (start, stop), special in zip(
                e.ids, e.tokens, e.offsets, e.special_tokens_mask, strict=True
            ):
                if special:
                    row.append(
                        {"id": tid, "text": tok, "special": True, "start": None, "stop": None}
                    )
                else:
                    piece = text[start:stop]
                    row.append(
                        {"id": tid, "text": piece, "special": False, "start": start, "stop": stop}
                    )
            out.append(row)
        return out

    def encode_to_length(self, text: str, length: int) -> Encoded:
        """Exactly `length` tokens of real text, repeating it as needed (for validation)."""
        repeated = text
        while len(self._full.encode(repeated).ids) < length:
            repeated = repeated + " " + text
        tok = Tokenizer.from_str(self._full.to_str())
        tok.enable_truncation(length)
        e = tok.encode(repeated)
        return Encoded(e.ids, e.attention_mask, e.type_ids, len(e.ids))
