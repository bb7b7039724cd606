"""Inputs longer than a model's length, embedded whole: overlapping windows and their pooling.

`long_inputs: "chunk"` cuts a text's tokens into windows of the model's length that overlap by
an eighth of it; each window is one more item of the request (priced, admitted and batched as
any other), and the input's vector is the token-weighted mean of its windows' vectors,
renormalised when the model normalises (as vLLM's chunked processing pools).

`long_inputs: "late"` (late chunking) reads a text up to the model's full length in one pass and
pools each span's tokens (the client's character spans, or its sentences) to a vector of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_registry.adapters.text import TextTokenizer
from model_registry.errors import InputTooLong, InvalidInput
from model_registry.types import Content, Embedding, Result, Results, Text, Token, TokenIds

MODES = ("error", "chunk", "late")
#: The share of a window's text tokens that the next window reads again.
OVERLAP = 1 / 8


@dataclass(frozen=True, slots=True)
class Window:
    """One window's token ids (special tokens included) and how many text tokens it holds."""

    ids: tuple[int, ...]
    weight: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A request's inputs as the items that run: `groups[i]` are input i's positions in `contents`."""

    contents: tuple[Content, ...]
    groups: tuple[tuple[int, ...], ...]
    weights: tuple[int, ...]


def windows(ids: Sequence[int], length: int, leading: int, trailing: int) -> list[Window]:
    """`ids` (a whole text's tokens, `leading` and `trailing` special tokens around it) as windows
    of at most `length` tokens, each with the special tokens, overlapping by `OVERLAP` of the room."""
    head, body = list(ids[:leading]), list(ids[leading : len(ids) - trailing])
    tail = list(ids[len(ids) - trailing :]) if trailing else []
    room = length - leading - trailing
    if room < 2:
        raise InvalidInput(f"a length of {length} tokens leaves no room to window a text", param="long_inputs")
    stride = room - max(1, int(room * OVERLAP))
    starts = range(0, max(1, len(body) - room + stride), stride)
    return [Window(tuple(head + body[s : s + room] + tail), len(body[s : s + room])) for s in starts]


def plan_chunks(contents: Sequence[Content], tokenizer: TextTokenizer, prompt: str, cap: int, max_chunks: int) -> Plan:
    """Texts longer than `cap` tokens (with `prompt`) become their windows; other inputs run as
    they are. More than `max_chunks` windows in the request is `InvalidInput`, before any work."""
    out: list[Content] = []
    groups: list[tuple[int, ...]] = []
    weights: list[int] = []
    leading, trailing = tokenizer.specials_around
    for content in contents:
        parts = _parts(content, tokenizer, prompt, cap, leading, trailing)
        if parts is None:
            groups.append((len(out),))
            out.append(content)
            weights.append(1)
            continue
        groups.append(tuple(range(len(out), len(out) + len(parts))))
        out.extend(TokenIds(w.ids) for w in parts)
        weights.extend(w.weight for w in parts)
        if len(out) > max_chunks:
            raise InvalidInput(
                f"the request needs more than {max_chunks} items once its long inputs are windowed "
                f"(max_chunks_per_request); send fewer or shorter inputs",
                param="input",
            )
    return Plan(tuple(out), tuple(groups), tuple(weights))


def _parts(
    content: Content, tokenizer: TextTokenizer, prompt: str, cap: int, leading: int, trailing: int
) -> list[Window] | None:
    if not isinstance(content, Text):
        return None
    text = prompt + content.text
    ids = tokenizer.ids([text.lower() if tokenizer.do_lower_case else text], cut=None)[0]
    return windows(ids, cap, leading, trailing) if len(ids) > cap else None


def pool(vectors: Sequence[np.ndarray], weights: Sequence[int], normalize: bool) -> np.ndarray:
    """The token-weighted mean of window vectors, unit length when the model's vectors are."""
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])
    mean = (stacked * np.asarray(weights, dtype=np.float64)[:, None]).sum(axis=0) / float(sum(weights))
    if normalize:
        mean /= max(float(np.linalg.norm(mean)), 1e-12)
    pooled: np.ndarray = mean.astype(np.float32)
    return pooled


def merge(results: Results, plan: Plan, normalize: bool) -> Results:
    """The windows' results pooled back into one result per input, their tokens all counted."""
    items: list[Result] = []
    item_tokens: list[int] = []
    for group in plan.groups:
        counted = [results.item_tokens[i] for i in group] if results.item_tokens else []
        item_tokens.append(sum(counted))
        if len(group) == 1:
            items.append(results.items[group[0]])
            continue
        dense = [_dense(results.items[i]) for i in group]
        items.append(Embedding(dense=pool(dense, [plan.weights[i] for i in group], normalize)))
    return Results(tuple(items), results.tokens, tuple(item_tokens) if results.item_tokens else ())


def _dense(result: Result) -> np.ndarray:
    if not isinstance(result, Embedding) or result.dense is None:
        raise AssertionError("This is a bug: a chunked input's window has no dense vector")
    return result.dense


Span = tuple[int, int]
#: A sentence's end: a run of . ! or ? followed by whitespace. The look-behind starts a match only
#: at a run's first mark, so a long run that no whitespace follows is read once, not once per mark.
_END = re.compile(r"(?<![.!?])[.!?]+(?=\s)")
_NON_SPACE = re.compile(r"\S")


def check_span_count(count: int, max_spans: int) -> None:
    """`InvalidInput` when a request asks for more than `max_spans` spans (`max_chunks_per_request`)."""
    if count > max_spans:
        raise InvalidInput(f"the request has more than {max_spans} spans (max_chunks_per_request)", param="spans")


def sentences(text: str) -> list[Span]:
    """The character spans [start, end) of `text`'s sentences: each from a non-space character to
    the first `_END` after it, or to the end of the text (trailing whitespace left out). Linear in
    the text's length, as a client's text of any shape must be."""
    ends = [m.end() for m in _END.finditer(text)] + [len(text.rstrip())]
    spans = []
    start = 0
    for end in ends:
        first = _NON_SPACE.search(text, start, end)
        if first is not None:
            spans.append((first.start(), end))
        start = max(start, end)
    return spans


def plan_late(
    contents: Sequence[Content],
    tokenizer: TextTokenizer,
    prompt: str,
    spans: Sequence[Sequence[Span]] | None,
    max_spans: int,
) -> tuple[list[Content], list[tuple[Span, ...]]]:
    """Each text as its whole token ids and its spans as token ranges; a text longer than the
    model's length, a span outside its text or more than `max_spans` spans is `InvalidInput`."""
    if spans is not None and len(spans) != len(contents):
        raise InvalidInput(
            f"spans has {len(spans)} lists for {len(contents)} inputs; give one per input", param="spans"
        )
    wanted = [list(spans[i]) if spans is not None else sentences(_text(c, i).text) for i, c in enumerate(contents)]
    check_span_count(sum(len(w) for w in wanted), max_spans)  # before any tokenizing: the count alone decides
    out: list[Content] = []
    ranges: list[tuple[Span, ...]] = []
    for i, content in enumerate(contents):
        text = _text(content, i).text
        if not wanted[i]:
            what = f"spans[{i}] is empty" if spans is not None else f"input {i} has no sentence"
            raise InvalidInput(f"{what}: late chunking answers one vector per span", param="spans")
        tokens = _whole(tokenizer, prompt + text, i)
        ranges.append(token_ranges(tokens, wanted[i], len(text), len(prompt), i))
        out.append(TokenIds(tuple(t.id for t in tokens)))
    return out, ranges


def _text(content: Content, index: int) -> Text:
    if not isinstance(content, Text):
        raise InvalidInput(f"input {index}: long_inputs 'late' takes texts, not token ids", param="input")
    return content


def _whole(tokenizer: TextTokenizer, text: str, index: int) -> list[Token]:
    count = len(tokenizer.ids([text.lower() if tokenizer.do_lower_case else text], cut=None)[0])
    if count > tokenizer.max_length:
        raise InputTooLong(
            f"input {index} has {count} tokens, more than the model's limit of {tokenizer.max_length}; "
            "long_inputs 'late' reads an input in one pass (use 'chunk' for longer ones)",
            param="input",
        )
    return tokenizer.tokens([text], add_special_tokens=True)[0]


def token_ranges(
    tokens: Sequence[Token], spans: Sequence[Span], length: int, shift: int, index: int
) -> tuple[Span, ...]:
    """Character spans of a text of `length` characters (after a prompt of `shift`) as the token
    ranges [first, last + 1) of the tokens whose characters overlap them."""
    out = []
    for k, (start, end) in enumerate(spans):
        if not 0 <= start < end <= length:
            raise InvalidInput(
                f"input {index}: span {k} [{start}, {end}) is not within its {length} characters", param="spans"
            )
        inside = [
            i
            for i, t in enumerate(tokens)
            if t.start is not None and t.stop is not None and t.start < end + shift and t.stop > start + shift
        ]
        if not inside:
            raise InvalidInput(f"input {index}: span {k} [{start}, {end}) holds no token", param="spans")
        out.append((inside[0], inside[-1] + 1))
    return tuple(out)
