"""The OpenAI dialect: `POST /v1/embeddings`, `GET /v1/models` (and their unversioned twins).

`modality: image | audio` (Infinity's field) takes URLs or data URIs instead of texts.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import (
    engine_inputs,
    json_response,
    parse_body,
    registry_of,
    until_disconnected,
    vectors_response,
)
from infinity_server.encoding import dense_vectors, encode_vectors, numbers_in
from infinity_server.schemas.openai import EmbeddingRequest
from model_registry import ModelInfo, Results

_CREATED = int(time.time())


def embedding_list(
    model: str, results: Results, encoding_format: str, dimensions: int | None, embedding_type: str = "float32"
) -> dict[str, Any]:
    """The OpenAI list shape: one dense vector per input (cut to `dimensions` if asked)."""
    encoded = encode_vectors(dense_vectors(results, dimensions), embedding_type, encoding_format)
    data = [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(encoded)]
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


async def embeddings(request: Request) -> Response:
    body = await parse_body(request, EmbeddingRequest)
    registry = registry_of(request)
    async with engine_inputs(request, body.model, body.modality, body.inputs(), body.media_inputs) as inputs:
        options = body.truncation(body.truncate)
        work = registry.embed(body.model, inputs, prompt_name=body.prompt_name, priority=body.priority, **options)
        results = await until_disconnected(request, work)

    return await vectors_response(
        lambda: embedding_list(body.model, results, body.encoding_format, body.dimensions, body.embedding_type),
        numbers_in(results),
    )


def model_entry(info: ModelInfo) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "infinity-server",
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
        "error": info.error,
        **({"details": dict(info.extra)} if info.extra else {}),
    }


async def models(request: Request) -> Response:
    data = [model_entry(info) for info in registry_of(request).infos()]
    return json_response({"object": "list", "data": data})


routes = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
]
