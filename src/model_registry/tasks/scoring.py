"""Score text pairs on top of `Runner.run`: a cross-encoder reads each pair; an embedding model
embeds each distinct text once and scores the pair by cosine, or by MaxSim or the sparse dot
product for models with those outputs.

A dense model's pairs score by cosine even where its files declare another similarity function
(rerank uses that one): the routes this serves, TEI's `/similarity` and vLLM's `/score`, define
cosine whatever the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from model_registry.errors import InvalidInput
from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.tasks.rerank import (
    CROSS_ENCODER,
    embedding_scores,
    fit_left,
    method_output,
    pair_scores,
    rerank_method,
)
from model_registry.types import EmbedItem, PairItem, Result, Text


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


async def score(
    registry: Runner,
    model: str,
    pairs: Sequence[tuple[str, str]],
    *,
    raw_scores: bool = False,
    truncate: bool | None = None,
    truncation_direction: str = "right",
    priority: int | None = None,
    timeout: float | None = None,
) -> PairScores:
    """A relevance score per (text_1, text_2) pair, in input order.

    A cross-encoder reads each pair (its activation applied unless `raw_scores`); an embedding
    model embeds each distinct text once, without prompts, and scores the pair by cosine
    (MaxSim for multi-vector models, dot product for sparse ones).
    """
    spec = registry.spec(model)
    checked = check_pairs(pairs, registry.config.max_inputs_per_request, registry.config.max_input_chars)
    adapter = await registry.adapter(model)
    method = rerank_method(adapter.capabilities, model)
    cut = spec.truncate if truncate is None else truncate
    if method == CROSS_ENCODER:
        if cut and validation.cut_left(adapter, model, truncation_direction, pairs=True):
            seconds = await fit_left(registry, adapter, model, [b for _, b in checked], [a for a, _ in checked])
            checked = [(a, b) for (a, _), b in zip(checked, seconds, strict=True)]
        items = [PairItem(a, b, cut) for a, b in checked]
        results = await registry.run(model, items, priority=priority, timeout=timeout)
        return PairScores(tuple(pair_scores(results.items, raw_scores)), method, results.tokens)
    texts = list(dict.fromkeys(t for pair in checked for t in pair))
    wanted = frozenset({method_output(method)})
    left = validation.cut_left(adapter, model, truncation_direction)
    embedded_items = [EmbedItem(Text(t), wanted, "", False, cut, left) for t in texts]
    results = await registry.run(model, embedded_items, priority=priority, timeout=timeout)
    embedded = dict(zip(texts, results.items, strict=True))
    # A score per pair (MaxSim over token vectors for some models) is real compute: off the
    # event loop, as rerank's is.
    scores = await asyncio.to_thread(embedding_pair_scores, method, checked, embedded)
    return PairScores(tuple(scores), method, results.tokens)
