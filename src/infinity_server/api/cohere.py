"""Cohere's dialect: rerank (`/v1/rerank`, `/v2/rerank`) and embed (`/v1/embed`, `/v2/embed`).

Rerank results carry `document: {text}` only when `return_documents` is true (v1 returned them by
default, v2 does not); `meta` says how the scores were computed. Embed answers every asked
embedding type from one engine call; `input_type` picks the model's prompt of that role.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import (
    fetched_media,
    json_response,
    parse_body,
    registry_of,
    until_disconnected,
    vectors_response,
)
from infinity_server.encoding import dense_vectors, encode_vectors, numbers_in
from infinity_server.schemas.cohere import ROLES, CohereEmbedRequest, CohereRerankRequest
from model_registry import Content, InvalidInput, Modality, Results, Text

#: Cohere's embedding type -> (this server's dtype, JSON encoding).
_TYPES = {
    "float": ("float32", "float"),
    "int8": ("int8", "float"),
    "uint8": ("uint8", "float"),
    "binary": ("binary", "float"),
    "ubinary": ("ubinary", "float"),
    "base64": ("float32", "base64"),
}


async def _rerank(request: Request, version: str) -> Response:
    body = await parse_body(request, CohereRerankRequest)
    ranking = await until_disconnected(
        request,
        registry_of(request).rerank(
            body.model,
            body.query,
            body.texts(),
            top_n=body.top_n,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            instruction=body.instruction,
            max_tokens_per_doc=body.max_tokens_per_doc,
            priority=body.priority,
        ),
    )
    return_documents = body.return_documents if body.return_documents is not None else version == "1"
    results: list[dict[str, Any]] = []
    for r in ranking.results:
        entry: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if return_documents:
            entry["document"] = {"text": r.document}
        results.append(entry)
    meta = {
        "api_version": {"version": version},
        "billed_units": {"search_units": 1, "input_tokens": ranking.tokens},
        "tokens": {"input_tokens": ranking.tokens},
        "scoring_method": ranking.method,
    }
    return json_response({"id": str(uuid.uuid4()), "results": results, "meta": meta})


async def rerank_v1(request: Request) -> Response:
    return await _rerank(request, "1")


async def rerank_v2(request: Request) -> Response:
    return await _rerank(request, "2")


# ---- embed ----------------------------------------------------------------------------------------


@asynccontextmanager
async def _contents(request: Request, body: CohereEmbedRequest) -> AsyncIterator[tuple[list[Any], list[str]]]:
    """The engine's inputs and the `texts` echoed back (Cohere returns the texts it embedded);
    fetched images stay counted against the server's media budget until the block ends."""
    given = body.given()
    if given == "texts":
        yield list(body.texts or []), list(body.texts or [])
        return
    if given == "images":
        async with fetched_media(request, body.model, body.images or [], Modality.IMAGE) as images:
            yield list(images), []
        return
    contents: list[Content | None] = []
    urls: list[str] = []
    for i, item in enumerate(body.inputs or []):
        parts = [p.text for p in item.content if p.type == "text"]
        urls_here = [p.image_url.url for p in item.content if p.type == "image_url"]
        if urls_here and (parts or len(urls_here) > 1):
            raise InvalidInput(
                f"inputs {i} mixes {len(parts)} text and {len(urls_here)} image parts; this server embeds each "
                "input as one text or one image, so send them as separate inputs",
                param="inputs",
            )
        contents.append(Text("\n".join(parts)) if parts else None)
        urls.extend(urls_here)
    async with fetched_media(request, body.model, urls, Modality.IMAGE) as fetched:
        media = iter(fetched)
        merged = [c if c is not None else next(media) for c in contents]
        yield merged, [c.text for c in merged if isinstance(c, Text)]


def embed_body(body: CohereEmbedRequest, results: Results, texts: list[str], version: str) -> dict[str, Any]:
    vectors = dense_vectors(results, body.output_dimension, param="output_dimension")
    meta = {"api_version": {"version": version}, "billed_units": {"input_tokens": results.tokens}}
    answer: dict[str, Any] = {"id": str(uuid.uuid4()), "texts": texts, "meta": meta}
    if body.embedding_types is None and version == "1":
        return {
            **answer,
            "response_type": "embeddings_floats",
            "embeddings": encode_vectors(vectors, "float32", "float"),
        }
    kinds = body.embedding_types or ["float"]
    by_type = {kind: encode_vectors(vectors, *_TYPES[kind]) for kind in dict.fromkeys(kinds)}
    return {**answer, "response_type": "embeddings_by_type", "embeddings": by_type}


async def _embed(request: Request, version: str) -> Response:
    body = await parse_body(request, CohereEmbedRequest)
    role = ROLES[body.input_type] if body.input_type else None
    async with _contents(request, body) as (inputs, texts):
        work = registry_of(request).embed(
            body.model,
            inputs,
            role=role,
            truncate=body.truncate != "NONE",
            truncation_direction="left" if body.truncate == "START" else "right",
            max_tokens=body.max_tokens,
            priority=body.priority,
        )
        results = await until_disconnected(request, work)
    kinds = len(body.embedding_types or ["float"])
    return await vectors_response(lambda: embed_body(body, results, texts, version), kinds * numbers_in(results))


async def embed_v1(request: Request) -> Response:
    return await _embed(request, "1")


async def embed_v2(request: Request) -> Response:
    return await _embed(request, "2")


routes = [
    Route("/v1/rerank", rerank_v1, methods=["POST"]),
    Route("/v2/rerank", rerank_v2, methods=["POST"]),
    Route("/v1/embed", embed_v1, methods=["POST"]),
    Route("/v2/embed", embed_v2, methods=["POST"]),
]
