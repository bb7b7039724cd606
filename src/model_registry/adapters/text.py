"""Tokenizing and padding shared by every text adapter.

Tokenization happens once, in `prepare`: the token count is the item's cost and its usage, and an
over-long input with truncation off is rejected there, naming its index, the limit and its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.errors import InputTooLong, InvalidInput
from model_registry.types import Token

_UNBOUNDED = 1_000_000


def _truncating_copy(tokenizer: Any, max_length: int) -> Any | None:
    """A copy of the Rust tokenizer behind a fast `tokenizer`, set once to do what
    `tokenizer(texts, truncation=True, max_length=max_length)` does, or None for a slow one.

    The wrapper's own Python per call (checking and setting truncation, building a
    `BatchEncoding`) is half of a short text's tokenizing time (MiniLM here: 0.04 ms against
    0.09 ms for one sentence, 18.4 against 20.1 ms for 256). The copy is never reconfigured after
    this, so the prepare threads and the event loop share it safely; the wrapper, which sets
    truncation on its own Rust tokenizer per call, stays for the other calls.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length, stride=0, strategy="longest_first", direction=tokenizer.truncation_side)
    copy.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    return copy


@dataclass(frozen=True, slots=True)
class Tokens:
    """One tokenized item: its ids and how many leading tokens are prompt (for pooling)."""

    ids: tuple[int, ...]
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Padded:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    left: bool


class TextTokenizer:
    """A Hugging Face fast tokenizer with the model's length limit and padding side."""

    def __init__(self, directory: Path, *, max_length: int | None, config: Any, do_lower_case: bool = False) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        limits = [max_length] if max_length else []
        if not limits:
            model_max = getattr(self.tokenizer, "model_max_length", None)
            positions = getattr(config, "max_position_embeddings", None)
            limits = [n for n in (model_max, positions) if isinstance(n, int) and 0 < n < _UNBOUNDED]
        self.max_length = min(limits) if limits else 512
        self.do_lower_case = do_lower_case
        self.left_padding = self.tokenizer.padding_side == "left"
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        self.pad_id = int(pad)
        self.vocab_size = len(self.tokenizer)
        self._special = set(self.tokenizer.all_special_ids)
        self._prompt_lengths: dict[str, int] = {}
        self._truncating = _truncating_copy(self.tokenizer, self.max_length)

    def prompt_length(self, prompt: str) -> int:
        """Tokens of `prompt` as a prefix, without a trailing special token (as sentence-transformers)."""
        if prompt not in self._prompt_lengths:
            ids = self.tokenizer(prompt)["input_ids"]
            length = len(ids) - (1 if ids and ids[-1] in self._special else 0)
            self._prompt_lengths[prompt] = length
        return self._prompt_lengths[prompt]

    def encode(
        self,
        texts: Sequence[str],
        truncate: Sequence[bool],
        *,
        offset: int = 0,
        left: Sequence[bool] = (),
        keep: Sequence[int] = (),
    ) -> list[list[int]]:
        """Token ids per text; too long with truncation off is `InputTooLong` naming the index.

        Where `left[i]`, an over-long text loses its first tokens instead of its last, keeping the
        leading special tokens and its first `keep[i]` tokens (the prompt, as `prompt_length` counts).
        """
        if not texts:  # the fast tokenizer raises IndexError on an empty batch
            return []
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        limit = self.max_length
        encoded: list[list[int]]
        if self._truncating is not None:
            encoded = [e.ids for e in self._truncating.encode_batch(list(texts), add_special_tokens=True)]
        else:
            encoded = self.tokenizer(list(texts), truncation=True, max_length=limit, return_attention_mask=False)[
                "input_ids"
            ]
        for i in (i for i, side in enumerate(left) if side and len(encoded[i]) >= limit and truncate[i]):
            encoded[i] = self._cut_left(texts[i], keep[i] if i < len(keep) else 0)
        for i, (ids, cut) in enumerate(zip(encoded, truncate, strict=True)):
            if not cut and len(ids) >= limit:
                full = len(self.tokenizer(texts[i], return_attention_mask=False)["input_ids"])
                if full > limit:
                    raise InputTooLong(
                        f"input {offset + i} has {full} tokens, more than the model's limit of {limit}; "
                        "shorten it or allow truncation",
                        param="input",
                    )
        return encoded

    def _leading_specials(self) -> int:
        """How many special tokens the tokenizer puts before a text ([CLS]: 1; most decoders: 0)."""
        sample = "a b c"
        plain = self.tokenizer(sample, add_special_tokens=False)["input_ids"]
        full = self.tokenizer(sample)["input_ids"]
        return next((k for k in range(len(full)) if full[k : k + len(plain)] == plain), 0)

    def _cut_left(self, text: str, keep: int) -> list[int]:
        """`text`'s ids within the limit, its earliest tokens dropped (specials and `keep` kept)."""
        ids: list[int] = self.tokenizer(text, return_attention_mask=False)["input_ids"]
        if len(ids) <= self.max_length:
            return ids
        head = ids[
            : max(self._leading_specials(), keep)
        ]  # `keep` (the prompt's length) already counts leading specials
        return head + ids[len(ids) - (self.max_length - len(head)) :]

    def check_ids(self, ids: Sequence[int], truncate: bool, index: int) -> list[int]:
        """Client-given token ids: in the vocabulary, within the limit (or truncated)."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidInput(
                f"input {index} has token id {bad}, outside the vocabulary [0, {self.vocab_size})", param="input"
            )
        if len(ids) > self.max_length:
            if not truncate:
                raise InputTooLong(
                    f"input {index} has {len(ids)} tokens, more than the model's limit of {self.max_length}",
                    param="input",
                )
            ids = ids[: self.max_length]
        return list(ids)

    def tokens(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[Token]]:
        """Each text's tokens as the model reads them (cut to its limit), with character spans."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        encoded = self.tokenizer(
            list(texts),
            add_special_tokens=add_special_tokens,
            truncation=True,
            max_length=self.max_length,
            return_offsets_mapping=True,
            return_attention_mask=False,
        )
        rows = []
        for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"], strict=True):
            row = []
            for token_id, (start, stop) in zip(ids, offsets, strict=True):
                special = token_id in self._special
                span = (None, None) if special else (int(start), int(stop))
                piece = self.tokenizer.convert_ids_to_tokens(token_id) if special else text[start:stop]
                row.append(Token(int(token_id), str(piece), special, *span))
            rows.append(row)
        return rows

    def first_tokens(self, texts: Sequence[str], count: int) -> list[str]:
        """Each text cut after its first `count` tokens (as this tokenizer splits it, no specials)."""
        if count < 1:
            raise InvalidInput(f"the token limit must be at least 1, got {count}", param="max_tokens_per_doc")
        encoded = self.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        return [
            text if len(offsets) <= count else text[: offsets[count - 1][1]]
            for text, offsets in zip(texts, encoded["offset_mapping"], strict=True)
        ]

    def last_tokens(self, texts: Sequence[str], room: Sequence[int]) -> list[str]:
        """Each text's end that fits in `room[i]` tokens, starting at a word (so that it tokenizes
        as the same tokens again); a text that fits is unchanged."""
        encoded = self.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        cut = []
        for text, offsets, fits in zip(texts, encoded["offset_mapping"], room, strict=True):
            first = max(len(offsets) - max(fits, 0), 0)
            while 0 < first < len(offsets) and not text[offsets[first][0] - 1].isspace():
                first += 1  # a token inside a word: start at the next word
            cut.append(text if first == 0 else text[offsets[first][0] :] if first < len(offsets) else "")
        return cut

    def fit_left(self, texts: Sequence[str], queries: Sequence[str] | None = None) -> list[str]:
        """`texts` cut at their start to fit the limit, alone or after their pair's query (kept whole)."""
        if queries is None:
            rooms = [self.max_length - int(self.tokenizer.num_special_tokens_to_add(pair=False))] * len(texts)
        else:
            unique = sorted(set(queries))
            lengths = dict(
                zip(unique, map(len, self.tokenizer(unique, add_special_tokens=False)["input_ids"]), strict=True)
            )
            room = self.max_length - int(self.tokenizer.num_special_tokens_to_add(pair=True))
            rooms = [room - lengths[q] for q in queries]
        return self.last_tokens(texts, rooms)

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
        for index, row in enumerate(ids):
            self.check_ids(row, True, index)
        return [str(self.tokenizer.decode(list(row), skip_special_tokens=skip_special_tokens)) for row in ids]

    def pad(self, sequences: Sequence[Sequence[int]]) -> Padded:
        return pad(sequences, self.pad_id, left=self.left_padding)


def pad(sequences: Sequence[Sequence[int]], pad_id: int, *, left: bool) -> Padded:
    """Pad to the longest sequence on the given side; the mask marks real tokens."""
    longest = max((len(s) for s in sequences), default=0)
    ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        n = len(seq)
        if n == 0:
            continue
        if left:
            ids[row, longest - n :] = seq
            mask[row, longest - n :] = 1
        else:
            ids[row, :n] = seq
            mask[row, :n] = 1
    return Padded(ids, mask, left)
