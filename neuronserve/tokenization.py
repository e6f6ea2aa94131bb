"""Batch tokenization through the Rust `tokenizers` library.

Whole batches go through `encode_batch` in one call (the `transformers` wrapper costs
~10 ms per padded batch of 32 on these CPUs; the Rust call a fraction of that).
Padding is not done here: the bucket grid decides it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# a text, a text pair, or an encoded image
Text = str | tuple[str, str] | bytes


@dataclass
class Encoded:
    ids: list[int]
    attention_mask: list[int]
    type_ids: list[int]
    # tokens before any truncation: tells whether truncation dropped text
    full_length: int
    # the `tokenizers` Encoding: character offsets into the text sent, word ids, special
    # tokens (token-level tasks answer with them)
    source: Any = None
    # a chunk of a longer text (`chunks`): the text's tokens it holds, from, to (special
    # tokens not counted)
    span: tuple[int, int] | None = None

    def row(self) -> dict[str, list[int]]:
        return {
            "input_ids": self.ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.type_ids,
        }


# transformers' clean_up_tokenization (tokenization_utils_base.py), in its order
CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


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
        self._to_length: Tokenizer | None = None
        self._to_length_lock = threading.Lock()
        # one tokenizer for every overlap a request asks for (set per call, under the
        # lock): one kept per value would let requests grow the worker's memory. Made on
        # first use: most models never window or chunk a text
        self._overflowing: Tokenizer | None = None
        self._overflowing_lock = threading.Lock()

    def _cutting(self, direction: str) -> Tokenizer:
        # made on first use: most deployments never cut from the left
        if direction not in self._truncating:
            tok = Tokenizer.from_str(self._json)
            tok.no_padding()
            tok.enable_truncation(self.max_length, direction=direction)
            self._truncating[direction] = tok
        return self._truncating[direction]

    def encode(
        self,
        texts: Sequence[Text],
        truncate: bool,
        direction: str = "right",
        offsets: bool = True,
    ) -> list[Encoded]:
        """Encode without truncation; re-encode only the over-long texts when allowed,
        keeping the first (`direction` right) or the last (left) `max_length` tokens.

        Texts over `max_length` keep their full ids when `truncate` is False so the
        caller can refuse them with their real length. `offsets`: whether the encodings
        keep each token's character span (a token-level task answers with them); without
        them a long text tokenizes in about two thirds of the time.
        """
        if not texts:
            return []
        method = "encode_batch" if offsets else "encode_batch_fast"
        batch = getattr(self._full, method)(list(texts))
        out = [Encoded(e.ids, e.attention_mask, e.type_ids, len(e), e) for e in batch]
        if truncate:
            long_idx = [i for i, e in enumerate(out) if e.full_length > self.max_length]
            if long_idx:
                cutting = getattr(self._cutting(direction), method)
                again = cutting([texts[i] for i in long_idx])
                for i, e in zip(long_idx, again, strict=True):
                    out[i] = Encoded(e.ids, e.attention_mask, e.type_ids, out[i].full_length, e)
        return out

    def lengths(self, texts: Sequence[Text]) -> list[int]:
        """Tokens the model reads of each text: its length, at most `max_length` (all a
        truncated text keeps; a longer one is refused). No ids, masks or offsets are
        built, so a count costs much less than `encode`."""
        return [min(len(e), self.max_length) for e in self._full.encode_batch_fast(list(texts))]

    def windows(self, pair: tuple[str, str], stride: int) -> list[Encoded]:
        """(question, context) as windows of at most `max_length` tokens, each holding the
        whole question and a part of the context, consecutive parts overlapping by
        `stride` tokens: the transformers question-answering pipeline's split
        (truncation="only_second", return_overflowing_tokens). Raises ValueError when the
        question leaves no room for context."""
        return [
            Encoded(e.ids, e.attention_mask, e.type_ids, len(e), e)
            for e in self._overflow(pair[0], pair[1], stride, "only_second")
        ]

    def chunks(self, text: str, overlap: int) -> list[Encoded]:
        """`text` as windows of at most `max_length` tokens on token boundaries, each with
        the model's special tokens, consecutive windows sharing `overlap` tokens of the
        text (one window when it fits); each window's `span` says which. Raises
        ValueError when `overlap` leaves no room for new text in a window."""
        out, start = [], 0
        for e in self._overflow(text, None, overlap, "longest_first"):
            held = len(e) - sum(e.special_tokens_mask)
            out.append(
                Encoded(e.ids, e.attention_mask, e.type_ids, len(e), e, (start, start + held))
            )
            start += held - overlap
        return out

    def chunk_count(self, texts: Sequence[str], overlap: int) -> int:
        """How many chunks `chunks` makes of `texts` in all, from their lengths alone."""
        room = self.max_length - self._full.num_special_tokens_to_add(False)
        step = max(1, room - overlap)
        lengths = [
            len(e) for e in self._full.encode_batch_fast(list(texts), add_special_tokens=False)
        ]
        return sum(1 if n <= room else 1 + -(-(n - room) // step) for n in lengths)

    def _overflow(self, text: str, pair: str | None, stride: int, strategy: str) -> list[Any]:
        """`text` (and `pair`) cut to `max_length`, with every overflowing window."""
        with self._overflowing_lock:
            if self._overflowing is None:
                self._overflowing = Tokenizer.from_str(self._json)
                self._overflowing.no_padding()
            try:
                self._overflowing.enable_truncation(
                    self.max_length, stride=stride, strategy=strategy
                )
                first = self._overflowing.encode(text, pair)
            # the Rust error says why (no room); a stride it cannot take panics, which
            # reaches Python as a BaseException that must not end the worker's thread
            except BaseException as e:
                if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                    raise
                raise ValueError(str(e).splitlines()[0]) from None
        return [first, *first.overflowing]

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this, special tokens included."""
        return int(self._full.get_vocab_size(with_added_tokens=True))

    def id_to_token(self, token_id: int) -> str:
        return self._full.id_to_token(token_id) or ""

    def tokens_to_string(self, tokens: Sequence[str]) -> str:
        """What transformers' `convert_tokens_to_string` gives for a fast tokenizer."""
        decoder = self._full.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool, clean_up: bool) -> str:
        """What transformers' `decode` gives (clean_up: its clean_up_tokenization_spaces,
        as the artifact recorded it for this tokenizer)."""
        text = self._full.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if clean_up:
            for a, b in CLEAN_UP:
                text = text.replace(a, b)
        return text

    @property
    def continuing_subword_prefix(self) -> str | None:
        return getattr(self._full.model, "continuing_subword_prefix", None)

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

    def cut_to_tokens(self, texts: Sequence[str], most: int) -> list[str]:
        """Each text, cut after its first `most` tokens (special tokens not counted), at
        the end of that token's characters: what Cohere's `max_tokens_per_doc` asks."""
        batch = self._full.encode_batch_fast(list(texts), add_special_tokens=False)
        long = [i for i, e in enumerate(batch) if len(e) > most]
        if not long:
            return list(texts)
        out = list(texts)
        cut = self._full.encode_batch([texts[i] for i in long], add_special_tokens=False)
        for i, e in zip(long, cut, strict=True):
            out[i] = texts[i][: e.offsets[most - 1][1]]
        return out

    def encode_to_length(self, text: str, length: int) -> Encoded:
        """Exactly `length` tokens of real text, repeating it as needed (for validation)."""
        repeated = text
        while len(self._full.encode(repeated).ids) < length:
            repeated = repeated + " " + text
        # one tokenizer cut to each length asked in turn: building one from the JSON costs
        # far more than an encode, and compile asks for every bucket's lengths
        with self._to_length_lock:
            if self._to_length is None:
                self._to_length = Tokenizer.from_str(self._json)
                self._to_length.no_padding()
            self._to_length.enable_truncation(length)
            e = self._to_length.encode(repeated)
        return Encoded(e.ids, e.attention_mask, e.type_ids, len(e))
