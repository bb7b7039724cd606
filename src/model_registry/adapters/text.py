"""Tokenizing and padding shared by every text adapter.

Tokenization happens once, in `prepare`: the token count is the item's cost and its usage, and an
over-long input with truncation off is rejected there, naming its index, the limit and its length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from copy import copy as shallow_copy
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, cast

import numpy as np

from model_registry.errors import ConfigError, InputTooLong, InvalidInput
from model_registry.types import EmbedItem, Text, Token, TokenIds

_UNBOUNDED = 1_000_000
#: Families whose position ids start after the padding id, as RoBERTa's do: their table holds
#: `pad_token_id + 1` fewer usable positions than its size.
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "longformer"})


def rotary(config: Any) -> bool:
    """Whether the model encodes positions by rotation (transformers 5 gives every such config
    `rope_parameters`; jina-v3's XLM-R says `position_embedding_type: rotary`): it has no table to
    run out of, and its files' `max_seq_length` decides how long an input may be."""
    return getattr(config, "rope_parameters", None) is not None or (
        getattr(config, "position_embedding_type", None) == "rotary"
    )


def usable_positions(config: Any) -> int | None:
    """How many tokens the model's position table can take, where its config says."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0 or positions >= _UNBOUNDED:
        return None
    if getattr(config, "model_type", None) in _OFFSET_POSITIONS:
        pad = getattr(config, "pad_token_id", None)
        positions -= (pad if isinstance(pad, int) else 1) + 1
    return positions


def _fixed_copy(
    tokenizer: Any, max_length: int | None, strategy: str = "longest_first", direction: str | None = None
) -> Any:
    """A copy of the Rust tokenizer behind the fast `tokenizer`, set once to cut at `max_length`
    with `strategy` on the `direction` side (None: the tokenizer's own `truncation_side`), or never
    to cut with None, and never reconfigured.

    The wrapper's `__call__` sets truncation and padding on its one Rust tokenizer at each call
    that asks for different ones, so two threads calling it with different settings get each
    other's (a text that should be cut comes back whole), or a "RuntimeError: Already borrowed"
    when one reconfigures it while the other encodes. The prepare threads and the event loop
    tokenize at once, so every encoding goes through copies that nothing reconfigures. They also
    skip the wrapper's own Python per call, which is half of a short text's tokenizing time
    (MiniLM here: 0.04 ms against 0.09 ms for one sentence, 18.4 against 20.1 ms for 256).
    """
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    copy.no_padding()
    if max_length is None:
        copy.no_truncation()
    else:
        side = direction or tokenizer.truncation_side
        copy.enable_truncation(max_length, stride=0, strategy=strategy, direction=side)
    copy.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    return copy


@dataclass(frozen=True, slots=True)
class Row:
    """One encoded text or pair from a slow tokenizer, shaped as the Rust `Encoding`."""

    ids: list[int]
    type_ids: list[int]
    offsets: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Tokens:
    """One tokenized item: its ids and how many leading tokens are prompt (for pooling)."""

    ids: tuple[int, ...]
    prompt_tokens: int = 0
    #: Token ranges pooled one by one (late chunking); empty: the item pools as a whole.
    spans: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Padded:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    left: bool


def special_token_flags(directory: Path) -> dict[str, bool]:
    """tokenizer_config.json's `add_eos_token`, with `add_bos_token`, where it asks for the end token.

    Models pooled on their last token (e5-mistral and other Mistral and Llama embedders) are
    trained on `<s> text </s>` and say so there; transformers 5 reads the flags only when they are
    passed, and without them a `tokenizer.json` adds `<s>` alone, so the last word would be pooled.
    Both are passed: the end token alone would drop `<s>`."""
    path = directory / "tokenizer_config.json"
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(settings, dict) or settings.get("add_eos_token") is not True:
        return {}
    return {"add_eos_token": True, "add_bos_token": settings.get("add_bos_token") is not False}


class TextTokenizer:
    """A Hugging Face tokenizer with the model's length limit and padding side, safe to share
    between threads.

    The wrapper (`tokenizer`) answers read-only questions (special ids, vocabulary, decoding);
    a fast tokenizer's encodings come from Rust copies fixed at load (see `_fixed_copy`), a
    slow one's from the wrapper, which keeps no state between calls.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_length: int | None,
        config: Any,
        do_lower_case: bool = False,
        from_files: bool = False,
    ) -> None:
        """`from_files`: read the tokenizer with the `tokenizers` library alone (`FileTokenizer`),
        for the install without transformers."""
        if from_files:
            from model_registry.adapters.tokenizer_files import FileTokenizer

            self.tokenizer: Any = FileTokenizer(directory)
        else:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(directory), **special_token_flags(directory))
        positions = usable_positions(config)
        if max_length and positions and max_length > positions and not rotary(config):
            # Past its position table the model fails every longer batch, or reads positions it
            # never learnt: refused at load rather than answered with 500s.
            raise ConfigError(
                f"max_length {max_length} is more than the {positions} positions this model's "
                f"{getattr(config, 'model_type', 'encoder')} config gives; set max_length to {positions} or less"
            )
        limits = [max_length] if max_length else []
        if not limits:
            model_max = getattr(self.tokenizer, "model_max_length", None)
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
        self._fixed: dict[str | None, Any] = {}
        self._left: Any = None  # `enable_left_cut`'s tokenizer
        if getattr(self.tokenizer, "backend_tokenizer", None) is not None:
            self._fixed = {
                None: _fixed_copy(self.tokenizer, None),
                "longest_first": _fixed_copy(self.tokenizer, self.max_length),
            }
        self._leading = self._leading_specials()
        self._specials = self.specials(pair=False)

    def enable_pairs(self) -> None:
        """Make `run` able to cut pairs from their second text alone. Called at load, before any
        thread tokenizes: one more Rust copy, which only cross-encoders need."""
        if self._fixed and "only_second" not in self._fixed:
            self._fixed["only_second"] = _fixed_copy(self.tokenizer, self.max_length, "only_second")

    def enable_left_cut(self) -> None:
        """Make `run(left=True)` cut at the start of the texts, as the tokenizer does with
        truncation_side left (a pair loses tokens from its longer text first). Called at load,
        before any thread tokenizes: one more copy, which only classifiers' pairs need."""
        if self._left is not None:
            return
        if self._fixed:
            self._left = _fixed_copy(self.tokenizer, self.max_length, direction="left")
            return
        # A slow tokenizer keeps no state between calls but this attribute: a shallow copy shares the rest.
        self._left = shallow_copy(self.tokenizer)
        self._left.truncation_side = "left"

    def run(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        cut: str | None = "longest_first",
        left: bool = False,
        special: bool = True,
        offsets: bool = False,
    ) -> Sequence[Any]:
        """Encode `texts` (with `pairs` as second texts), cut to the limit with the `cut`
        strategy ("longest_first", "only_second" after `enable_pairs`) or whole with None; with
        `left` (after `enable_left_cut`, "longest_first" only), cut at the start of the texts.

        Each result has `ids` and `type_ids`, and `offsets` where asked (fast tokenizers always
        have them; slow ones cannot give them).
        """
        if not texts:  # the fast tokenizer raises IndexError on an empty batch
            return []
        inputs: list[Any] = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        if left:
            assert self._left is not None, "This is a bug: a left cut without enable_left_cut"
            assert cut == "longest_first", f"This is a bug: a left cut with {cut!r}"
        if self._fixed:
            fixed = self._left if left else self._fixed.get(cut)
            assert fixed is not None, f"This is a bug: no tokenizer cuts with {cut!r} (enable_pairs?)"
            return cast("list[Any]", fixed.encode_batch(inputs, add_special_tokens=special))
        wrapper = self._left if left else self.tokenizer
        encoded = wrapper(
            list(texts),
            None if pairs is None else list(pairs),
            add_special_tokens=special,
            truncation=cut or False,
            max_length=self.max_length if cut else None,
            return_token_type_ids=True,
            return_attention_mask=False,
            return_offsets_mapping=offsets,
        )
        spans = encoded["offset_mapping"] if offsets else [[] for _ in inputs]
        return [
            Row(list(i), list(t), [tuple(o) for o in span])
            for i, t, span in zip(encoded["input_ids"], encoded["token_type_ids"], spans, strict=True)
        ]

    def ids(self, texts: Sequence[str], *, special: bool = True, cut: str | None = "longest_first") -> list[list[int]]:
        """Token ids per text (see `run`)."""
        return [list(e.ids) for e in self.run(texts, cut=cut, special=special)]

    def prompt_length(self, prompt: str) -> int:
        """Tokens of `prompt` as a prefix, without a trailing special token (as sentence-transformers)."""
        if prompt not in self._prompt_lengths:
            ids = self.ids([prompt], cut=None)[0]
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
        caps: Sequence[int | None] = (),
    ) -> list[list[int]]:
        """Token ids per text; too long with truncation off is `InputTooLong` naming the index.

        `caps[i]` lowers text i's limit below the model's (the request's own token limit, special
        tokens and prompt included). Where `left[i]`, an over-long text loses its first tokens
        instead of its last, keeping the leading special tokens and its first `keep[i]` tokens (the
        prompt, as `prompt_length` counts).
        """
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        encoded = self.ids(texts)
        for i, ids in enumerate(encoded):
            cap = self.cap(caps[i] if i < len(caps) else None)
            side = i < len(left) and left[i]
            if len(ids) < cap or (len(ids) == cap and truncate[i] and not side and cap == self.max_length):
                continue  # within the limit, or cut at the model's limit on the right as asked
            full = self.ids([texts[i]], cut=None)[0]
            if len(full) <= cap:
                encoded[i] = full
            elif not truncate[i]:
                raise InputTooLong(
                    f"input {offset + i} has {len(full)} tokens, more than {self._limit_name(cap)} of {cap}; "
                    "shorten it or allow truncation",
                    param="input",
                )
            else:
                encoded[i] = self._cut_to(full, cap, left=side, keep=keep[i] if i < len(keep) else 0)
        return encoded

    @property
    def specials_around(self) -> tuple[int, int]:
        """How many special tokens the tokenizer puts before and after a text."""
        return self._leading, self._specials - self._leading

    def cap(self, limit: int | None) -> int:
        """A request's token limit within the model's; fewer tokens than the special tokens leave
        no room for text and are `InvalidInput`."""
        if limit is None or limit >= self.max_length:
            return self.max_length
        if limit <= self._specials:
            raise InvalidInput(
                f"a limit of {limit} tokens leaves no room for text after the model's {self._specials} special tokens",
                param="max_tokens",
            )
        return limit

    def _limit_name(self, cap: int) -> str:
        return "the model's limit" if cap == self.max_length else "the request's token limit"

    def _leading_specials(self) -> int:
        """How many special tokens the tokenizer puts before a text ([CLS]: 1; most decoders: 0)."""
        sample = ["a b c"]
        plain = self.ids(sample, special=False, cut=None)[0]
        full = self.ids(sample, cut=None)[0]
        return next((k for k in range(len(full)) if full[k : k + len(plain)] == plain), 0)

    def _cut_to(self, ids: list[int], cap: int, *, left: bool, keep: int) -> list[int]:
        """A whole text's `ids` cut to `cap` tokens, its special tokens kept where the tokenizer
        put them: the end of the text goes (as the tokenizer's own truncation cuts it), or with
        `left` its start after the leading specials and the first `keep` tokens (the prompt's
        length, which already counts the leading specials)."""
        if left:
            head = ids[: max(self._leading, keep)]
            return head + ids[len(ids) - (cap - len(head)) :]
        trailing = self._specials - self._leading
        return ids[: cap - trailing] + ids[len(ids) - trailing :]

    def check_ids(self, ids: Sequence[int], truncate: bool, index: int, cap: int | None = None) -> list[int]:
        """Client-given token ids: in the vocabulary, within the limit (or truncated)."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidInput(
                f"input {index} has token id {bad}, outside the vocabulary [0, {self.vocab_size})", param="input"
            )
        limit = self.max_length if cap is None else min(cap, self.max_length)
        if len(ids) > limit:
            if not truncate:
                raise InputTooLong(
                    f"input {index} has {len(ids)} tokens, more than {self._limit_name(limit)} of {limit}",
                    param="input",
                )
            ids = ids[:limit]
        return list(ids)

    def tokens(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        cut: str | None = "longest_first",
        byte_offsets: bool = False,
        max_tokens: int | None = None,
    ) -> list[list[Token]]:
        """Each text's tokens as the model reads them, cut to its limit with `cut` (see `run`) or
        whole with None, with character spans, or UTF-8 byte spans with `byte_offsets` (TEI's).
        More than `max_tokens` in all is `InvalidInput`: texts are encoded a group at a time, so
        the work and the rows held stop near the limit."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        rows: list[list[Token]] = []
        total = 0
        for group in _groups(texts, _GROUP_CHARS):
            encoded = self.run(group, cut=cut, special=add_special_tokens, offsets=True)
            total += sum(len(e.ids) for e in encoded)
            if max_tokens is not None and total > max_tokens:
                raise InvalidInput(
                    f"these inputs have {total:,} tokens or more, more than the {max_tokens:,} that one answer "
                    "may hold; send fewer or shorter inputs in each request",
                    param="inputs",
                )
            rows += [self._token_row(text, e, byte_offsets) for text, e in zip(group, encoded, strict=True)]
        return rows

    def _token_row(self, text: str, encoding: Any, byte_offsets: bool) -> list[Token]:
        """One encoded text's tokens; special tokens have their own text and no span."""
        at = _byte_offsets(text) if byte_offsets else None
        row = []
        for token_id, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True):
            if token_id in self._special:
                row.append(Token(int(token_id), str(self.tokenizer.convert_ids_to_tokens(token_id)), True, None, None))
                continue
            piece = text[start:stop]
            if at is not None:
                start, stop = at[start], at[stop]
            row.append(Token(int(token_id), piece, False, int(start), int(stop)))
        return row

    def _offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each whole text's token spans, without special tokens."""
        return [list(e.offsets) for e in self.run(texts, cut=None, special=False, offsets=True)]

    def first_tokens(self, texts: Sequence[str], count: int) -> list[str]:
        """Each text cut after its first `count` tokens (as this tokenizer splits it, no specials)."""
        if count < 1:
            raise InvalidInput(f"the token limit must be at least 1, got {count}", param="max_tokens_per_doc")
        return [
            text if len(offsets) <= count else text[: offsets[count - 1][1]]
            for text, offsets in zip(texts, self._offsets(texts), strict=True)
        ]

    def last_tokens(self, texts: Sequence[str], room: Sequence[int]) -> list[str]:
        """Each text's end that fits in `room[i]` tokens, starting at a word (so that it tokenizes
        as the same tokens again); a text that fits is unchanged."""
        cut = []
        for text, offsets, fits in zip(texts, self._offsets(texts), room, strict=True):
            first = max(len(offsets) - max(fits, 0), 0)
            while 0 < first < len(offsets) and not text[offsets[first][0] - 1].isspace():
                first += 1  # a token inside a word: start at the next word
            cut.append(text if first == 0 else text[offsets[first][0] :] if first < len(offsets) else "")
        return cut

    def fit_left(self, texts: Sequence[str], queries: Sequence[str] | None = None) -> list[str]:
        """`texts` cut at their start to fit the limit, alone or after their pair's query (kept whole)."""
        if queries is None:
            rooms = [self.max_length - self.specials(pair=False)] * len(texts)
        else:
            unique = sorted(set(queries))
            lengths = dict(zip(unique, map(len, self.ids(unique, special=False, cut=None)), strict=True))
            room = self.max_length - self.specials(pair=True)
            rooms = [room - lengths[q] for q in queries]
        return self.last_tokens(texts, rooms)

    def specials(self, *, pair: bool) -> int:
        """The special tokens that encoding adds to a text or a pair."""
        return int(self.tokenizer.num_special_tokens_to_add(pair=pair))

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
        for index, row in enumerate(ids):
            self.check_ids(row, True, index)
        return [str(self.tokenizer.decode(list(row), skip_special_tokens=skip_special_tokens)) for row in ids]

    def pad(self, sequences: Sequence[Sequence[int]]) -> Padded:
        return pad(sequences, self.pad_id, left=self.left_padding)


def text_tokens(tokenizer: TextTokenizer, items: Sequence[EmbedItem], *, include_prompt: bool) -> list[Tokens]:
    """Tokenize the text and token-id items of one request, prompts prepended; a prompt's tokens
    are counted out of the pooling unless the model's pooling `include_prompt`s them."""
    tokens: list[Tokens | None] = [None] * len(items)
    texts, where = [], []
    for i, item in enumerate(items):
        if isinstance(item.content, TokenIds):
            checked = tokenizer.check_ids(item.content.ids, item.truncate, i, item.max_tokens)
            tokens[i] = Tokens(tuple(checked))
        elif isinstance(item.content, Text):
            texts.append(item.prompt + item.content.text)
            where.append(i)
        else:
            raise InvalidInput(f"input {i}: this model embeds text only", param="input")
    left = [items[i].truncate_left for i in where]
    keep = [tokenizer.prompt_length(items[i].prompt) if items[i].prompt else 0 for i in where]
    caps = [items[i].max_tokens for i in where]
    encoded = tokenizer.encode(texts, [items[i].truncate for i in where], left=left, keep=keep, caps=caps)
    for i, ids in zip(where, encoded, strict=True):
        prompt = items[i].prompt
        prompt_tokens = tokenizer.prompt_length(prompt) if prompt and not include_prompt else 0
        tokens[i] = Tokens(tuple(ids), prompt_tokens)
    return [t for t in tokens if t is not None]


#: Characters encoded at once by `TextTokenizer.tokens`: enough texts for the Rust tokenizer's
#: threads, few enough that a request over its token limit stops soon after it.
_GROUP_CHARS = 65_536


def _groups(texts: Sequence[str], chars: int) -> list[list[str]]:
    """`texts` in order, in groups of about `chars` characters (a longer text alone)."""
    groups: list[list[str]] = [[]]
    size = 0
    for text in texts:
        if groups[-1] and size + len(text) > chars:
            groups.append([])
            size = 0
        groups[-1].append(text)
        size += len(text)
    return groups if groups[0] else []


def _byte_offsets(text: str) -> list[int] | None:
    """Where each character of `text` starts in its UTF-8 bytes, and its end (index len(text)); None
    for ASCII, whose byte offsets are its character offsets. Lone surrogates count their 3 bytes."""
    if text.isascii():
        return None
    return list(accumulate((len(c.encode("utf-8", "surrogatepass")) for c in text), initial=0))


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
