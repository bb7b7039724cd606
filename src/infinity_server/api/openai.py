"""The OpenAI dialect: embeddings and the model list, and Infinity's unversioned twins of both.

`modality: image | audio` (Infinity's field) takes URLs or data URIs instead of texts. The model
list is one shape for both clients: OpenAI's fields, and Infinity's `stats` and `owned_by`, which
`infinity_client` requires.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.convertors import register_url_convertor
from starlette.requests import Request

from infinity_server.api.common import ModelName, engine_inputs, registry_of
from infinity_server.encoding import dense_vectors, encode_vectors, numbers_in
from infinity_server.routing import PLAIN_ERRORS, Vectors, get, post
from infinity_server.schemas.openai import EmbeddingRequest, InfinityEmbeddingRequest
from infinity_server.schemas.responses import (
    EmbeddingData,
    EmbeddingResponse,
    LateEmbeddingData,
    LateEmbeddingResponse,
    ModelEntry,
    ModelList,
    SpanVector,
    Usage,
)
from model_registry import EmbedCall, Embedding, ModelInfo, Results, Span, sentences

_CREATED = int(time.time())
_EXAMPLE = {"model": "all-MiniLM-L6-v2", "input": ["a sentence to embed"]}


class ModelId(ModelName):
    """`{name:model_id}`: a model name that does not end in `/load` or `/unload`, so that a GET of an
    admin route's path answers 405 (and `Allow: POST`) instead of "no such model"."""

    regex = "(?s:.*)(?<!/load)(?<!/unload)"


register_url_convertor("model_id", ModelId())


def usage(results: Results) -> Usage:
    return {"prompt_tokens": results.tokens, "total_tokens": results.tokens}


def embedding_list(
    model: str, results: Results, encoding_format: str, embedding_type: str = "float32"
) -> EmbeddingResponse:
    """The OpenAI list shape: one dense vector per input."""
    encoded = encode_vectors(dense_vectors(results), embedding_type, encoding_format)
    data: list[EmbeddingData] = [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(encoded)]
    return {"object": "list", "data": data, "model": model, "usage": usage(results)}


def late_spans(
    results: Results, texts: Sequence[Any], spans: Sequence[Sequence[Span]] | None
) -> list[list[SpanVector]]:
    """Late chunking's answer per input: each span's character offsets and its vector."""
    answer = []
    for i, result in enumerate(results.items):
        offsets = spans[i] if spans is not None else sentences(str(texts[i]))
        vectors = result.multivector if isinstance(result, Embedding) else None
        assert vectors is not None, "This is a bug: a late-chunked input has no span vectors"
        answer.append(
            [SpanVector(start=s, end=e, embedding=v.tolist()) for (s, e), v in zip(offsets, vectors, strict=True)]
        )
    return answer


async def embeddings(request: Request, body: EmbeddingRequest) -> Vectors[EmbeddingResponse | LateEmbeddingResponse]:
    async with engine_inputs(request, body.model, body.modality, body.inputs(), body.media_inputs) as inputs:
        options = body.truncation(body.truncate)
        results = await registry_of(request).embed_call(
            EmbedCall(
                body.model,
                inputs,
                prompt_name=body.prompt_name,
                task=body.chosen_adapter(),
                priority=body.priority,
                long_inputs=body.long_inputs,
                spans=body.spans,
                dimensions=body.dimensions,
                **options,
            )
        )
    if body.long_inputs == "late":
        spans = late_spans(results, inputs, body.spans)

        def late() -> LateEmbeddingResponse:
            data: list[LateEmbeddingData] = [
                {"object": "embedding", "index": i, "spans": s} for i, s in enumerate(spans)
            ]
            return {"object": "list", "data": data, "model": body.model, "usage": usage(results)}

        return Vectors(late, numbers_in(results))
    return Vectors(
        lambda: embedding_list(body.model, results, body.encoding_format, body.embedding_type),
        numbers_in(results),
    )


async def infinity_embeddings(
    request: Request, body: InfinityEmbeddingRequest
) -> Vectors[EmbeddingResponse | LateEmbeddingResponse]:
    """OpenAI's answer with Infinity's `id` and `created` beside it."""
    answer = await embeddings(request, body)
    stamp = {"id": f"infinity-{uuid.uuid4()}", "created": int(time.time())}

    def build() -> EmbeddingResponse | LateEmbeddingResponse:
        return {**answer.build(), **stamp}  # type: ignore[return-value]

    return Vectors(build, answer.numbers)


def model_entry(info: ModelInfo) -> ModelEntry:
    entry: ModelEntry = {
        "id": info.name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "infinity",
        "kind": info.kind.value,
        "capabilities": sorted(c.value for c in info.capabilities),
        "backend": info.backend,
        "device": info.device,
        "dtype": info.dtype,
        "status": info.state.value,
        "pinned": info.pinned,
        "max_length": info.max_length,
        "dimensions": info.dimensions,
        "footprint_bytes": info.footprint_bytes,
        "last_used": info.last_used,
        "queue_depth": info.queue_depth,
        "stats": {"queue_depth": info.queue_depth, "queue_tokens": info.queue_tokens},
        "error": info.error,
    }
    if info.extra:
        entry["details"] = dict(info.extra)
    return entry


async def models(request: Request) -> ModelList:
    return {"object": "list", "data": [model_entry(info) for info in registry_of(request).infos()]}


async def model(request: Request) -> ModelEntry:
    """One model's entry (`client.models.retrieve(id)`); an unknown one is a 404 in OpenAI's shape."""
    return model_entry(registry_of(request).info(request.path_params["name"]))


operations = [
    post("/v1/embeddings", embeddings, "Embeddings (OpenAI; text, image or audio)", batch=True, example=_EXAMPLE),
    post("/embeddings", infinity_embeddings, "Embeddings (Infinity's unversioned path)", example=_EXAMPLE),
    get("/v1/models", models, "The configured models and their state", errors=PLAIN_ERRORS),
    get("/models", models, "The configured models (unversioned path)", errors=PLAIN_ERRORS),
    get("/v1/models/{name:model_id}", model, "One model and its state", errors=(*PLAIN_ERRORS, 404)),
]
