"""The OpenAI dialect: `POST /v1/embeddings`, `GET /v1/models`, `GET /v1/models/{id}`, and
Infinity's unversioned `POST /embeddings` and `GET /models`.

`modality: image | audio` (Infinity's field) takes URLs or data URIs instead of texts. The model
list is one shape for both clients: OpenAI's fields, and Infinity's `stats` and `owned_by`, which
`infinity_client` requires.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from starlette.convertors import register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import (
    ModelName,
    engine_inputs,
    json_response,
    parse_body,
    registry_of,
    until_disconnected,
    vectors_response,
)
from infinity_server.encoding import dense_vectors, encode_vectors, numbers_in
from infinity_server.schemas.openai import EmbeddingRequest, InfinityEmbeddingRequest
from model_registry import Embedding, ModelInfo, Results, Span, sentences

_CREATED = int(time.time())


class ModelId(ModelName):
    """`{name:model_id}`: a model name that does not end in `/load` or `/unload`, so that a GET of an
    admin route's path answers 405 (and `Allow: POST`) instead of "no such model"."""

    regex = "(?s:.*)(?<!/load)(?<!/unload)"


register_url_convertor("model_id", ModelId())


def embedding_list(
    model: str, results: Results, encoding_format: str, dimensions: int | None, embedding_type: str = "float32"
) -> dict[str, Any]:
    """The OpenAI list shape: one dense vector per input (cut to `dimensions` if asked)."""
    encoded = encode_vectors(dense_vectors(results, dimensions), embedding_type, encoding_format)
    data = [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(encoded)]
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def late_spans(
    results: Results, texts: Sequence[Any], spans: Sequence[Sequence[Span]] | None
) -> list[list[dict[str, Any]]]:
    """Late chunking's answer per input: each span's character offsets and its vector."""
    answer = []
    for i, result in enumerate(results.items):
        offsets = spans[i] if spans is not None else sentences(str(texts[i]))
        vectors = result.multivector if isinstance(result, Embedding) else None
        assert vectors is not None, "This is a bug: a late-chunked input has no span vectors"
        answer.append(
            [{"start": s, "end": e, "embedding": v.tolist()} for (s, e), v in zip(offsets, vectors, strict=True)]
        )
    return answer


async def embeddings(request: Request) -> Response:
    return await _embeddings(request, await parse_body(request, EmbeddingRequest))


async def infinity_embeddings(request: Request) -> Response:
    return await _embeddings(request, await parse_body(request, InfinityEmbeddingRequest))


async def _embeddings(request: Request, body: EmbeddingRequest) -> Response:
    registry = registry_of(request)
    async with engine_inputs(request, body.model, body.modality, body.inputs(), body.media_inputs) as inputs:
        options = body.truncation(body.truncate)
        work = registry.embed(
            body.model,
            inputs,
            prompt_name=body.prompt_name,
            priority=body.priority,
            long_inputs=body.long_inputs,
            spans=body.spans,
            **options,
        )
        results = await until_disconnected(request, work)
    if body.long_inputs == "late":
        data = [
            {"object": "embedding", "index": i, "spans": s}
            for i, s in enumerate(late_spans(results, inputs, body.spans))
        ]
        usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
        return await vectors_response(
            lambda: {"object": "list", "data": data, "model": body.model, "usage": usage}, numbers_in(results)
        )

    return await vectors_response(
        lambda: embedding_list(body.model, results, body.encoding_format, body.dimensions, body.embedding_type),
        numbers_in(results),
    )


def model_entry(info: ModelInfo) -> dict[str, Any]:
    return {
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
        **({"details": dict(info.extra)} if info.extra else {}),
    }


async def models(request: Request) -> Response:
    data = [model_entry(info) for info in registry_of(request).infos()]
    return json_response({"object": "list", "data": data})


async def model(request: Request) -> Response:
    """One model's entry (`client.models.retrieve(id)`); an unknown one is a 404 in OpenAI's shape."""
    return json_response(model_entry(registry_of(request).info(request.path_params["name"])))


routes = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/embeddings", infinity_embeddings, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models/{name:model_id}", model, methods=["GET"]),
]
