"""Rerank images or audio clips against a text query on top of `Runner.run`.

A cross-encoder that reads images (Qwen3-VL-Reranker: `Adapter.rerank_media`) scores each
(query, image) pair itself, and a document holding a text and an image (`Mixed`) as one pair.
Multi-vector models (ColPali) score by MaxSim over their token vectors; the others (CLIP,
open_clip, CLAP) by the cosine of their vectors in the shared space.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.media.similarity import cosine, maxsim
from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.tasks.embedding import embed
from model_registry.types import (
    Capability,
    Embedding,
    Media,
    Mixed,
    Modality,
    Output,
    PairItem,
    Result,
    Results,
    Score,
)


async def rerank_media(
    registry: Runner,
    model: str,
    query: str,
    media: Sequence[Media | Mixed],
    *,
    priority: int | None = None,
    timeout: float | None = None,
    instruction: str | None = None,
) -> Results:
    """Score each image (or audio clip, or a text with an image) against a text query; one `Score`
    per item, in input order. `instruction` replaces a cross-encoder's default instruction (one
    that takes instructions). A text with an image is one document for a cross-encoder that reads
    images, and one input for an embedder that reads both together; others refuse it."""
    adapter = await registry.adapter(model)
    validation.check_instruction_length(instruction, registry.config.max_input_chars)
    validation.check_instruction(adapter, model, instruction)
    if Capability.RERANK in adapter.capabilities:
        for index, item in enumerate(media):
            if isinstance(item, Mixed):
                validation.content(index, item, registry.config.max_input_chars)
        pairs = media_pairs(model, adapter.rerank_media, query, media, instruction)
        return await registry.run(model, pairs, priority=priority, timeout=timeout)
    outputs = media_rerank_outputs(model, adapter.capabilities, query)
    options: dict[str, Any] = {"outputs": outputs, "priority": priority, "timeout": timeout}
    asked, documents = await asyncio.gather(
        embed(registry, model, [query], **options), embed(registry, model, list(media), **options)
    )
    # MaxSim over many pages is real compute: off the event loop, like every scoring step.
    return await asyncio.to_thread(media_scores, asked, documents, multivector=Output.MULTIVECTOR in outputs)


def media_pairs(
    model: str, readable: frozenset[Modality], query: str, media: Sequence[Media | Mixed], instruction: str | None
) -> list[PairItem]:
    """(query, document) pairs of a cross-encoder whose documents are media, or a text with an
    image (the pair's document text and its image): each medium must be one it reads."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("the query must be non-empty text", param="query")
    pairs = []
    for index, item in enumerate(media):
        medium, text = (item.image, item.text) if isinstance(item, Mixed) else (item, "")
        if medium.modality not in readable:
            what = f"reads {', '.join(sorted(m.value for m in readable))} documents" if readable else "reads text only"
            raise UnsupportedOperation(
                f"the model '{model}' {what}; document {index} is {medium.modality.value}", param="documents"
            )
        pairs.append(PairItem(query, text, True, instruction, medium))
    return pairs


def media_rerank_outputs(model: str, capabilities: frozenset[Capability], query: str) -> tuple[Output, ...]:
    """What to embed: multi-vectors for late-interaction models, else dense vectors."""
    if not {Capability.EMBED_IMAGE, Capability.EMBED_AUDIO} & capabilities:
        raise UnsupportedOperation(
            f"the model '{model}' does not embed images or audio; rerank media with a CLIP, CLAP or ColPali model",
            param="model",
        )
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("the query must be non-empty text", param="query")
    return (Output.MULTIVECTOR,) if Capability.MULTIVECTOR in capabilities else (Output.DENSE,)


def _array(result: Result, multivector: bool) -> np.ndarray:
    array = (result.multivector if multivector else result.dense) if isinstance(result, Embedding) else None
    assert array is not None, "This is a bug: an embedding model returned no vector for an input"
    return array


def media_scores(query: Results, documents: Results, *, multivector: bool) -> Results:
    """MaxSim (multi-vectors) or cosine (dense) of the one query against each document."""
    asked = _array(query.items[0], multivector)
    vectors = [_array(d, multivector) for d in documents.items]
    scores = [maxsim(asked, d) for d in vectors] if multivector else cosine(asked, np.stack(vectors)).tolist()
    return Results(tuple(Score(float(s)) for s in scores), query.tokens + documents.tokens)
