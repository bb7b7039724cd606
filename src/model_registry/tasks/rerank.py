"""Rerank on top of `Runner.run`: which method a model ranks by, the ranking, and the task itself.

A cross-encoder scores each (query, document) pair itself. A model without one ranks by its
embeddings: MaxSim over token vectors when it has them (ColBERT, BGE-M3), else the dot product of
sparse vectors (SPLADE), else its dense vectors by the similarity function its files declare
(sentence-transformers' `similarity_fn_name`: cosine, dot, euclidean or manhattan; cosine where
none is declared). A model with more than one output (BGE-M3) also ranks by a weighted sum of its
parts on request: `hybrid_scores`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.errors import InvalidInput, UnsupportedOperation, not_finite
from model_registry.media.similarity import DENSE, maxsim, sparse_dot
from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Kind,
    Output,
    PairItem,
    Result,
    Results,
    Score,
    Similarity,
    Text,
)

CROSS_ENCODER = "cross-encoder"
MAXSIM = "maxsim"
SPARSE_DOT = "sparse-dot"
COSINE = Similarity.COSINE.value
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


def rerank_method(capabilities: frozenset[Capability], name: str, similarity: Similarity = Similarity.COSINE) -> str:
    """How a model with these capabilities ranks documents, its dense vectors by `similarity`
    (whose value names the method); `UnsupportedOperation` if it cannot."""
    if Capability.RERANK in capabilities:
        return CROSS_ENCODER
    if Capability.MULTIVECTOR in capabilities:
        return MAXSIM
    if Capability.EMBED_TEXT in capabilities:
        return similarity.value
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
    """Scores of each document embedding against the query embedding, by `method`; a score of NaN
    or infinity (vectors that overflowed) is `BatchFailed`, never a rank."""
    scores = _embedding_scores(method, query, documents, mean_maxsim=mean_maxsim)
    bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
    if bad is not None:
        raise not_finite(f"the model's vectors score document {bad} as")
    return scores


def _embedding_scores(method: str, query: Result, documents: Sequence[Result], *, mean_maxsim: bool) -> list[float]:
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
    return [float(s) for s in DENSE[Similarity(method)](query.dense, matrix)]


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


#: The largest weight a request may give an output: scores stay finite, and the weights' ratios,
#: which are all that ranks, reach a million to one.
MAX_WEIGHT = 1000.0


def hybrid_weights(
    capabilities: frozenset[Capability],
    name: str,
    asked: Mapping[str, float | None] | None,
    default: Mapping[Any, float] | None,
) -> dict[Output, float]:
    """Each output's weight: the request's, else the model's default (its entry's `rerank_weights`,
    else `PUBLISHED_WEIGHTS`); an output the model lacks may only weigh 0, and none may weigh less."""
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
        if value is not None and not 0 <= value <= MAX_WEIGHT:
            raise InvalidInput(f"weights.{key} must be from 0 to {MAX_WEIGHT:g}, got {value}", param="weights")
        if value is not None and out not in has and value != 0:
            raise UnsupportedOperation(f"the model '{name}' has no {key} output to weigh", param="weights")
        if value is not None and out in has:
            weights[out] = float(value)
    if not any(weights.values()):  # every score would be 0: no ranking at all
        given = ", ".join(f"{out.value}: {w:g}" for out, w in weights.items())
        raise InvalidInput(
            f"the weights ({given}) are all 0; give at least one output a positive weight", param="weights"
        )
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
    if not all(math.isfinite(score) for score in fused):  # never answered, never sorted first
        raise not_finite("the weighted sum of a document's scores is")
    return fused, parts


def _has(result: Result, out: Output) -> bool:
    return isinstance(result, Embedding) and getattr(result, out.value) is not None


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


@dataclass(frozen=True)
class RerankCall:
    """One rerank call: what each dialect turns its body into (`Registry.rerank_call`), and what
    `Registry.rerank`'s keywords build.

    Rank `documents` by relevance to `query`, best first; `Ranking.method` says how.

    A cross-encoder applies its activation (sigmoid) unless `raw_scores`; embedding models
    score by MaxSim, sparse dot product or a dense model's similarity function, which have no
    activation to skip. `similarity` replaces the one the dense model declares (vLLM's rerank
    defines cosine whatever the model).
    `max_tokens_per_doc` scores only each document's first tokens (results keep the whole text);
    `truncation_direction` "left" cuts an over-long document at its start (the query stays whole).
    `instruction` replaces an LLM reranker's default instruction for this request.
    `weights` (or `return_parts`) ranks a model with several outputs by the weighted sum of
    their scores, omitted weights taking the model's defaults; `return_parts` keeps each part.
    """

    model: str
    query: str
    documents: Sequence[str]
    top_n: int | None = None
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: str = "right"
    max_tokens_per_doc: int | None = None
    instruction: str | None = None
    weights: Mapping[str, float | None] | None = None
    return_parts: bool = False
    similarity: Similarity | None = None
    priority: int | None = None
    timeout: float | None = None


async def rerank(registry: Runner, model: str, query: str, documents: Sequence[str], **options: Any) -> Ranking:
    """Rank `documents` by relevance to `query`, best first. `options` are `RerankCall`'s."""
    return await rerank_call(registry, RerankCall(model, query, documents, **options))


async def rerank_call(registry: Runner, request: RerankCall) -> Ranking:
    """Run one `RerankCall`."""
    model, query, documents, top_n = request.model, request.query, request.documents, request.top_n
    raw_scores, truncate, truncation_direction = request.raw_scores, request.truncate, request.truncation_direction
    max_tokens_per_doc, instruction, similarity = request.max_tokens_per_doc, request.instruction, request.similarity
    weights, return_parts, priority, timeout = request.weights, request.return_parts, request.priority, request.timeout
    spec, limits = registry.spec(model), registry.config
    docs = check_rerank_input(query, documents, limits.max_inputs_per_request, limits.max_input_chars, top_n)
    validation.check_instruction_length(instruction, limits.max_input_chars)
    adapter = await registry.adapter(model)
    method = rerank_method(adapter.capabilities, model, adapter.similarity if similarity is None else similarity)
    validation.check_instruction(adapter, model, instruction)
    hybrid = None
    if weights is not None or return_parts:
        hybrid = hybrid_weights(adapter.capabilities, model, weights, spec.rerank_weights)
    cut = spec.truncate if truncate is None else truncate
    scored = docs
    if max_tokens_per_doc is not None:
        tokenizer, limit = validation.text_tokenizer(adapter, model), max_tokens_per_doc
        scored = await registry.on_model_threads(model, lambda: tokenizer.first_tokens(docs, limit))
    if method == CROSS_ENCODER:
        if cut and validation.cut_left(adapter, model, truncation_direction, pairs=True):
            scored = await fit_left(registry, adapter, model, scored, [query] * len(scored))
        pairs = [PairItem(query, d, cut, instruction) for d in scored]
        results = await registry.run(model, pairs, priority=priority, timeout=timeout)
        return ranking(docs, pair_scores(results.items, raw_scores), top_n, method, results.tokens)
    wanted = frozenset({method_output(method)}) if hybrid is None else hybrid_outputs(hybrid, return_parts)
    prompts = adapter.prompts
    left = validation.cut_left(adapter, model, truncation_direction)
    # A Router's query and document routes (its tasks), as encode_query and encode_document take them.
    routed = "query" in adapter.tasks and "document" in adapter.tasks
    query_task, doc_task = ("query", "document") if routed else (None, None)
    query_item = EmbedItem(Text(query), wanted, prompts.get("query", ""), True, cut, left, task=query_task)
    doc_prompt = prompts.get("document", prompts.get("passage", ""))
    docs_items = (EmbedItem(Text(d), wanted, doc_prompt, False, cut, left, task=doc_task) for d in scored)
    items = [query_item, *docs_items]
    results = await registry.run(model, items, priority=priority, timeout=timeout)
    # BGE-M3 averages MaxSim over the query's tokens; ColBERT sums it. Off the event loop: MaxSim
    # over many documents is real compute.
    mean, parts = adapter.kind == Kind.MULTI_OUTPUT, return_parts
    return await asyncio.to_thread(embedding_ranking, docs, results, method, hybrid, top_n, mean, parts)


async def fit_left(
    registry: Runner, adapter: Adapter, model: str, texts: Sequence[str], queries: Sequence[str] | None
) -> list[str]:
    """Texts (documents of pairs, or classified texts) cut at their start to fit, on the model's threads."""
    tokenizer = validation.text_tokenizer(adapter, model)
    return await registry.on_model_threads(model, lambda: tokenizer.fit_left(texts, queries))
