"""Rerank and classify on top of `Registry.run`: which method a model ranks by, and the results.

A cross-encoder scores each (query, document) pair itself. A model without one ranks by its
embeddings: MaxSim over token vectors when it has them (ColBERT, BGE-M3), else the dot product of
sparse vectors (SPLADE), else the cosine of dense vectors. A model with more than one output
(BGE-M3) also ranks by a weighted sum of its parts on request: `hybrid_scores`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.scoring import cosine, maxsim, sparse_dot
from model_registry.types import Capability, Embedding, Labels, Output, Result, Results, Score

CROSS_ENCODER = "cross-encoder"
MAXSIM = "maxsim"
SPARSE_DOT = "sparse-dot"
COSINE = "cosine"
HYBRID = "hybrid"

#: BGE-M3's authors' weights for dense, sparse and multi-vector scores (its model card's
#: `compute_score(..., weights_for_different_modes=[0.4, 0.2, 0.4])`); the default of every model
#: with more than one output whose entry sets no `rerank_weights` (a catalogue record may set it).
PUBLISHED_WEIGHTS: Mapping[Output, float] = MappingProxyType(
    {Output.DENSE: 0.4, Output.SPARSE: 0.2, Output.MULTIVECTOR: 0.4}
)
_OUTPUT_OF = {
    Capability.EMBED_TEXT: Output.DENSE,
    Capability.SPARSE: Output.SPARSE,
    Capability.MULTIVECTOR: Output.MULTIVECTOR,
}


@dataclass(frozen=True, slots=True)
class Ranked:
    """One document's place in a ranking: its position in the request and its score."""

    index: int
    score: float
    document: str
    #: Hybrid rankings asked for their parts: each output's own score.
    parts: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Ranking:
    """Documents by decreasing relevance (at most `top_n`), the method used and the tokens read."""

    results: tuple[Ranked, ...]
    method: str
    tokens: int


@dataclass(frozen=True, slots=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True, slots=True)
class Classification:
    """Per input, every label with its score, best first."""

    results: tuple[tuple[LabelScore, ...], ...]
    tokens: int


def rerank_method(capabilities: frozenset[Capability], name: str) -> str:
    """How a model with these capabilities ranks documents; `UnsupportedOperation` if it cannot."""
    if Capability.RERANK in capabilities:
        return CROSS_ENCODER
    if Capability.MULTIVECTOR in capabilities:
        return MAXSIM
    if Capability.EMBED_TEXT in capabilities:
        return COSINE
    if Capability.SPARSE in capabilities:
        return SPARSE_DOT
    have = ", ".join(sorted(c.value for c in capabilities)) or "none"
    raise UnsupportedOperation(f"the model '{name}' cannot rerank; its capabilities are: {have}", param="model")


def method_output(method: str) -> Output:
    return {MAXSIM: Output.MULTIVECTOR, SPARSE_DOT: Output.SPARSE}.get(method, Output.DENSE)


def check_rerank_input(
    query: object, documents: object, limit: int, max_chars: int, top_n: int | None = None
) -> list[str]:
    """The documents as strings; an empty query or list, or a non-string document, is `InvalidInput`."""
    if top_n is not None and top_n < 1:
        raise InvalidInput(f"top_n must be at least 1, got {top_n}", param="top_n")
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("query must be a non-empty string", param="query")
    if not isinstance(documents, Sequence) or isinstance(documents, str):
        raise InvalidInput("documents must be a list of strings", param="documents")
    if not documents:
        raise InvalidInput("documents must not be empty", param="documents")
    if len(documents) > limit:
        raise InvalidInput(
            f"documents has {len(documents)} items; at most {limit} are accepted per request", param="documents"
        )
    for i, document in enumerate(documents):
        if not isinstance(document, str):
            raise InvalidInput(f"document {i} must be a string, got {type(document).__name__}", param="documents")
        if len(document) > max_chars:
            raise InvalidInput(
                f"document {i} has {len(document):,} characters; the limit is {max_chars:,}", param="documents"
            )
    if len(query) > max_chars:
        raise InvalidInput(f"query has {len(query):,} characters; the limit is {max_chars:,}", param="query")
    return list(documents)


def pair_scores(results: Sequence[Result], raw_scores: bool) -> list[float]:
    scores = []
    for result in results:
        if not isinstance(result, Score):
            raise TypeError(f"This is a bug: a cross-encoder returned {type(result).__name__}")
        scores.append(result.logit if raw_scores and result.logit is not None else result.value)
    return scores


def embedding_scores(method: str, query: Result, documents: Sequence[Result], *, mean_maxsim: bool) -> list[float]:
    """Scores of each document embedding against the query embedding, by `method`."""
    if not isinstance(query, Embedding) or not all(isinstance(d, Embedding) for d in documents):
        raise TypeError("This is a bug: an embedding model returned something else")
    docs = [d for d in documents if isinstance(d, Embedding)]
    if method == MAXSIM:
        assert query.multivector is not None
        scale = 1.0 / max(len(query.multivector), 1) if mean_maxsim else 1.0
        return [maxsim(query.multivector, d.multivector) * scale for d in docs if d.multivector is not None]
    if method == SPARSE_DOT:
        assert query.sparse is not None
        return [sparse_dot(query.sparse, d.sparse) for d in docs if d.sparse is not None]
    assert query.dense is not None
    matrix = np.stack([d.dense for d in docs if d.dense is not None])
    return [float(s) for s in cosine(query.dense, matrix)]


def ranking(
    documents: Sequence[str],
    scores: Sequence[float],
    top_n: int | None,
    method: str,
    tokens: int,
    parts: Sequence[Mapping[str, float]] | None = None,
) -> Ranking:
    if len(scores) != len(documents):
        raise TypeError("This is a bug: a score is missing for some documents")
    order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))[: top_n or len(documents)]
    ranked = (Ranked(i, float(scores[i]), documents[i], None if parts is None else parts[i]) for i in order)
    return Ranking(tuple(ranked), method, tokens)


def hybrid_weights(
    capabilities: frozenset[Capability],
    name: str,
    asked: Mapping[str, float | None] | None,
    default: Mapping[Any, float] | None,
) -> dict[Output, float]:
    """Each output's weight: the request's, else the model's default (its entry's `rerank_weights`,
    else `PUBLISHED_WEIGHTS`); an output the model lacks may only weigh 0."""
    has = {out for cap, out in _OUTPUT_OF.items() if cap in capabilities}
    if len(has) < 2:
        raise UnsupportedOperation(
            f"the model '{name}' has one output; weights apply to models with dense, sparse and multi-vector outputs",
            param="weights",
        )
    base = {Output(k): v for k, v in default.items()} if default else PUBLISHED_WEIGHTS
    weights = {out: float(base.get(out, 0.0)) for out in Output if out in has}
    for key, value in (asked or {}).items():
        out = Output(key)
        if value is not None and out not in has and value != 0:
            raise UnsupportedOperation(f"the model '{name}' has no {key} output to weigh", param="weights")
        if value is not None and out in has:
            weights[out] = float(value)
    return weights


def hybrid_scores(
    weights: Mapping[Output, float], query: Result, documents: Sequence[Result], *, mean_maxsim: bool
) -> tuple[list[float], list[dict[str, float]]]:
    """s = w_dense * cosine + w_sparse * sparse dot + w_multivector * MaxSim, and each part."""
    parts: list[dict[str, float]] = [{} for _ in documents]
    methods = {Output.DENSE: COSINE, Output.SPARSE: SPARSE_DOT, Output.MULTIVECTOR: MAXSIM}
    for out, method in methods.items():
        if _has(query, out):  # the outputs asked: those weighed, or all when the parts are shown
            for part, score in zip(
                parts, embedding_scores(method, query, documents, mean_maxsim=mean_maxsim), strict=True
            ):
                part[out.value] = score
    fused = [sum(weights[Output(k)] * v for k, v in part.items()) for part in parts]
    return fused, parts


def _has(result: Result, out: Output) -> bool:
    return isinstance(result, Embedding) and getattr(result, out.value) is not None


def classification(results: Sequence[Result], raw_scores: bool, tokens: int) -> Classification:
    """Softmax over each input's label logits (or the logits themselves), labels best first."""
    rows = []
    for result in results:
        if not isinstance(result, Labels):
            raise TypeError(f"This is a bug: a classifier returned {type(result).__name__}")
        logits = np.asarray(result.logits, dtype=np.float64)
        values = logits if raw_scores else _softmax(logits)
        ranked = sorted(zip(result.names, values.tolist(), strict=True), key=lambda pair: -pair[1])
        rows.append(tuple(LabelScore(name, float(value)) for name, value in ranked))
    return Classification(tuple(rows), tokens)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    out: np.ndarray = shifted / shifted.sum()
    return out


@dataclass(frozen=True)
class PairScores:
    """One score per (text_1, text_2) pair, in input order, and how they were computed."""

    scores: tuple[float, ...]
    method: str
    tokens: int


def check_pairs(pairs: object, limit: int, max_chars: int) -> list[tuple[str, str]]:
    """The pairs as (str, str); an empty list, a non-string or blank text is `InvalidInput`."""
    if not isinstance(pairs, Sequence) or isinstance(pairs, str) or not pairs:
        raise InvalidInput("pairs must be a non-empty list of (text, text)", param="input")
    if len(pairs) > limit:
        raise InvalidInput(f"{len(pairs)} pairs; at most {limit} are accepted per request", param="input")
    checked = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise InvalidInput(f"pair {i} must be two strings", param="input")
        for text in pair:
            if not text.strip() or len(text) > max_chars:
                raise InvalidInput(f"pair {i} has an empty text or one over {max_chars:,} characters", param="input")
        checked.append((pair[0], pair[1]))
    return checked


def embedding_pair_scores(method: str, pairs: Sequence[tuple[str, str]], embedded: dict[str, Result]) -> list[float]:
    """Each pair's score from the embeddings of its two texts (cosine, MaxSim or sparse dot)."""
    return [embedding_scores(method, embedded[a], [embedded[b]], mean_maxsim=False)[0] for a, b in pairs]


def hybrid_outputs(weights: Mapping[Output, float], every: bool) -> frozenset[Output]:
    """The outputs a hybrid rerank embeds: those weighed, or all the model has when parts are shown."""
    return frozenset(o for o, w in weights.items() if w != 0 or every) or frozenset({Output.DENSE})


def embedding_ranking(
    documents: Sequence[str],
    results: Results,
    method: str,
    hybrid: Mapping[Output, float] | None,
    top_n: int | None,
    mean_maxsim: bool,
    return_parts: bool,
) -> Ranking:
    """The ranking of embedded documents (`results`: the query, then each document) by `method`,
    or by the weighted sum of their parts when `hybrid` weights are given."""
    query, embedded = results.items[0], results.items[1:]
    if hybrid is None:
        scores = embedding_scores(method, query, embedded, mean_maxsim=mean_maxsim)
        return ranking(documents, scores, top_n, method, results.tokens)
    fused, parts = hybrid_scores(hybrid, query, embedded, mean_maxsim=mean_maxsim)
    return ranking(documents, fused, top_n, HYBRID, results.tokens, parts if return_parts else None)
