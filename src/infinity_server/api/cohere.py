"""Cohere's dialect: rerank and embed, versions 1 and 2.

Rerank results carry their document only when `return_documents` is true (v1 returned them by
default, v2 does not) and a hybrid rerank's `parts` on request; `meta` says how the scores were
computed. v1 also ranks object documents on their `rank_fields`. vLLM serves its rerank at the same
two paths with the same core body: a body with a field only vLLM's has is answered by
`api.vllm.rerank` in vLLM's shape, any other in Cohere's. Embed answers every asked embedding type
from one engine call; `input_type` picks the model's prompt of that role.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request

from infinity_server.api import vllm
from infinity_server.api.common import fetched_media, parse_body, registry_of
from infinity_server.encoding import dense_vectors, encode_vectors, numbers_in
from infinity_server.routing import Vectors, post
from infinity_server.schemas.cohere import (
    ROLES,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereRerankRequest,
    CohereRerankResponse,
    CohereResult,
    CohereV1RerankRequest,
)
from infinity_server.schemas.responses import Vector
from infinity_server.schemas.vllm import VllmRerankRequest, VllmRerankResponse
from model_registry import Content, EmbedCall, InvalidInput, Mixed, Modality, RerankCall, Results, Text

#: Cohere's embedding type -> (this server's dtype, JSON encoding).
_TYPES = {
    "float": ("float32", "float"),
    "int8": ("int8", "float"),
    "uint8": ("uint8", "float"),
    "binary": ("binary", "float"),
    "ubinary": ("ubinary", "float"),
    "base64": ("float32", "base64"),
}


async def _rerank(request: Request, body: CohereRerankRequest, version: str) -> CohereRerankResponse:
    ranking = await registry_of(request).rerank_call(
        RerankCall(
            body.model,
            body.query,
            body.texts(),
            top_n=body.top_n,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            instruction=body.instruction,
            max_tokens_per_doc=body.max_tokens_per_doc,
            weights=body.weights.model_dump() if body.weights is not None else None,
            return_parts=body.return_parts,
            priority=body.priority,
        )
    )
    return_documents = body.return_documents if body.return_documents is not None else version == "1"
    results: list[CohereResult] = []
    for r in ranking.results:
        entry: CohereResult = {"index": r.index, "relevance_score": r.score}
        if return_documents:
            entry["document"] = body.returned(r.index)
        if r.parts is not None:
            entry["parts"] = dict(r.parts)
        results.append(entry)
    meta = {
        "api_version": {"version": version},
        "billed_units": {"search_units": 1, "input_tokens": ranking.tokens},
        "tokens": {"input_tokens": ranking.tokens},
        "scoring_method": ranking.method,
    }
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta}


async def rerank_v1(request: Request, body: dict[str, Any]) -> CohereRerankResponse | VllmRerankResponse:
    if vllm.rerank_body(body, CohereV1RerankRequest):
        return await vllm.rerank(request, await parse_body(request, VllmRerankRequest, body))
    return await _rerank(request, await parse_body(request, CohereV1RerankRequest, body), "1")


async def rerank_v2(request: Request, body: dict[str, Any]) -> CohereRerankResponse | VllmRerankResponse:
    if vllm.rerank_body(body, CohereRerankRequest):
        return await vllm.rerank(request, await parse_body(request, VllmRerankRequest, body))
    return await _rerank(request, await parse_body(request, CohereRerankRequest, body), "2")


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
    texts: list[str | None] = []  # each input's text parts joined, None for an image alone
    pictured: list[bool] = []
    urls: list[str] = []
    for i, item in enumerate(body.inputs or []):
        parts = [p.text for p in item.content if p.type == "text"]
        urls_here = [p.image_url.url for p in item.content if p.type == "image_url"]
        if len(urls_here) > 1:
            raise InvalidInput(
                f"inputs {i} holds {len(urls_here)} image parts; an input holds at most one image (with or without "
                "text), so send the others as separate inputs",
                param="inputs",
            )
        texts.append("\n".join(parts) if parts else None)
        pictured.append(bool(urls_here))
        urls.extend(urls_here)
    async with fetched_media(request, body.model, urls, Modality.IMAGE) as fetched:
        media = iter(fetched)
        merged: list[Content] = []
        for text, image in zip(texts, pictured, strict=True):
            if not image:
                merged.append(Text(text or ""))
            else:
                merged.append(next(media) if text is None else Mixed(text, next(media)))
        yield merged, [c.text for c in merged if isinstance(c, Text | Mixed)]


def embed_body(body: CohereEmbedRequest, results: Results, texts: list[str], version: str) -> CohereEmbedResponse:
    vectors = dense_vectors(results)
    meta = {"api_version": {"version": version}, "billed_units": {"input_tokens": results.tokens}}
    if body.embedding_types is None and version == "1":
        floats = encode_vectors(vectors, "float32", "float")
        return {
            "id": str(uuid.uuid4()),
            "texts": texts,
            "meta": meta,
            "response_type": "embeddings_floats",
            "embeddings": floats,
        }
    kinds = body.embedding_types or ["float"]
    by_type: dict[str, list[Vector]] = {kind: encode_vectors(vectors, *_TYPES[kind]) for kind in dict.fromkeys(kinds)}
    return {
        "id": str(uuid.uuid4()),
        "texts": texts,
        "meta": meta,
        "response_type": "embeddings_by_type",
        "embeddings": by_type,
    }


async def _embed(request: Request, body: CohereEmbedRequest, version: str) -> Vectors[CohereEmbedResponse]:
    role = ROLES[body.input_type] if body.input_type else None
    async with _contents(request, body) as (inputs, texts):
        results = await registry_of(request).embed_call(
            EmbedCall(
                body.model,
                inputs,
                role=role,
                truncate=body.truncate != "NONE",
                truncation_direction="left" if body.truncate == "START" else "right",
                max_tokens=body.max_tokens,
                priority=body.priority,
                dimensions=body.output_dimension,
                dimensions_param="output_dimension",
            )
        )
    kinds = len(body.embedding_types or ["float"])
    return Vectors(lambda: embed_body(body, results, texts, version), kinds * numbers_in(results))


async def embed_v1(request: Request, body: CohereEmbedRequest) -> Vectors[CohereEmbedResponse]:
    return await _embed(request, body, "1")


async def embed_v2(request: Request, body: CohereEmbedRequest) -> Vectors[CohereEmbedResponse]:
    return await _embed(request, body, "2")


_EXAMPLE = {
    "model": "all-MiniLM-L6-v2",
    "query": "what is a vector database",
    "documents": ["an index of vectors", "a cake"],
    "top_n": 1,
}
operations = [
    post(
        "/v1/rerank",
        rerank_v1,
        "Rerank (Cohere v1, or vLLM's body)",
        request=CohereV1RerankRequest | VllmRerankRequest,
        example=_EXAMPLE,
    ),
    post(
        "/v2/rerank",
        rerank_v2,
        "Rerank (Cohere v2, or vLLM's body)",
        request=CohereRerankRequest | VllmRerankRequest,
        example=_EXAMPLE,
    ),
    post("/v1/embed", embed_v1, "Embed (Cohere v1)"),
    post("/v2/embed", embed_v2, "Embed (Cohere v2; text and image inputs)"),
]
