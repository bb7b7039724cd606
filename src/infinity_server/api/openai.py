"""The OpenAI dialect: `POST /v1/embeddings`, `GET /v1/models` (and their unversioned twins)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, parse_body, registry_of, until_disconnected
from infinity_server.encoding import encode_vectors
from infinity_server.schemas.openai import EmbeddingRequest
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.types import Embedding, ModelInfo, Results

_CREATED = int(time.time())


def matryoshka(vectors: np.ndarray, dimensions: int | None, width: int) -> np.ndarray:
    """Keep the first `dimensions` components and re-normalise each row."""
    if dimensions is None:
        return vectors
    if not 1 <= dimensions <= width:
        raise InvalidInput(
            f"dimensions must be between 1 and {width} for this model, got {dimensions}", param="dimensions"
        )
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    normalised: np.ndarray = (cut / np.maximum(norms, 1e-12)).astype(np.float32)
    return normalised


def dense_matrix(results: Results) -> np.ndarray:
    rows = []
    for result in results.items:
        if not isinstance(result, Embedding) or result.dense is None:
            raise UnsupportedOperation("This is a bug: the model returned no dense vector")
        rows.append(result.dense)
    return np.stack(rows)


async def embeddings(request: Request) -> Response:
    body = await parse_body(request, EmbeddingRequest)
    registry = registry_of(request)
    if body.modality != "text":
        from infinity_server.api.media import embed_media  # the media module builds on this one

        return await embed_media(request, body)
    results = await until_disconnected(
        request,
        registry.embed(
            body.model,
            body.inputs(),
            prompt_name=body.prompt_name,
            truncate=body.truncate,
            priority=body.priority,
        ),
    )
    vectors = dense_matrix(results)
    vectors = matryoshka(vectors, body.dimensions, vectors.shape[1])
    encoded = encode_vectors(list(vectors), body.embedding_type, body.encoding_format)
    data = [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(encoded)]
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response({"object": "list", "data": data, "model": body.model, "usage": usage})


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
