"""A cross-encoder's (query, document) pairs, tokenized, and its score: shared by the reranker on
torch (`sequence`) and the one on a shipped ONNX graph (`onnx_text`), with no torch imported."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from model_registry.adapters.text import TextTokenizer, pad
from model_registry.backends.base import EncoderBatch
from model_registry.errors import InputTooLong
from model_registry.types import PairItem, Score


@dataclass(frozen=True, slots=True)
class Encoded:
    """One tokenized sequence (or pair): ids and the segment ids BERT-like models need."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]


def padded(tokenizer: TextTokenizer, encoded: Sequence[Encoded], *, type_ids: bool) -> EncoderBatch:
    """Encoded sequences padded into the engine's batch, with their segment ids where the model
    reads them."""
    ids = tokenizer.pad([e.ids for e in encoded])
    types = pad([e.type_ids for e in encoded], 0, left=ids.left).input_ids if type_ids else None
    return EncoderBatch(ids.input_ids, ids.attention_mask, types)


def activation_name(config: dict[str, Any]) -> str:
    """sentence-transformers stores a CrossEncoder's activation in config.json; sigmoid is its default."""
    st = config.get("sentence_transformers") or {}
    path = st.get("activation_fn") if isinstance(st, dict) else None
    path = path or config.get("sbert_ce_default_activation_function")
    return "identity" if isinstance(path, str) and path.endswith("Identity") else "sigmoid"


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)  # no overflow for very negative logits
    return exp / (1.0 + exp)


def score(logit: float, activation: str) -> Score:
    return Score(sigmoid(logit) if activation == "sigmoid" else logit, logit=logit)


def uncut_length(tokenizer: TextTokenizer, text: str, pair: str | None, encoded: Encoded) -> int | None:
    """The tokens of a text or pair read whole where `encoded`, at the model's limit, was cut from
    it; None where nothing was cut."""
    limit = tokenizer.max_length
    if len(encoded.ids) < limit:
        return None
    full = len(tokenizer.run([text], None if pair is None else [pair], cut=None)[0].ids)
    return full if full > limit else None


def encode_pairs(tokenizer: TextTokenizer, pairs: Sequence[PairItem]) -> list[Encoded]:
    """Tokenize pairs (after `tokenizer.enable_pairs()`); they lose tokens from the document,
    keeping the query whole unless the query alone leaves no room, in which case both sides are
    cut. A pair over the limit with truncation off is `InputTooLong`."""
    limit = tokenizer.max_length
    unique = sorted({p.query for p in pairs})  # a rerank request repeats one query for every document
    counted = dict(zip(unique, map(len, tokenizer.ids(unique, special=False, cut=None)), strict=True))
    room = limit - tokenizer.specials(pair=True) - 1
    out: dict[int, Encoded] = {}
    for strategy in ("only_second", "longest_first"):
        rows = [i for i, p in enumerate(pairs) if (counted[p.query] <= room) == (strategy == "only_second")]
        if not rows:
            continue
        encoded = tokenizer.run([pairs[i].query for i in rows], [pairs[i].document for i in rows], cut=strategy)
        out.update((row, Encoded(tuple(e.ids), tuple(e.type_ids))) for row, e in zip(rows, encoded, strict=True))
    for i, pair in enumerate(pairs):
        full = None if pair.truncate else uncut_length(tokenizer, pair.query, pair.document, out[i])
        if full is not None:
            raise InputTooLong(
                f"document {i} and the query have {full} tokens, more than the model's limit of {limit}; "
                "shorten it or allow truncation",
                param="documents",
            )
    return [out[i] for i in range(len(pairs))]
