"""Cohere's rerank dialect: `POST /v1/rerank` and `POST /v2/rerank` (same body, same answer).

Results carry `document: {text}` only when `return_documents` is true (v1 returned them by
default, v2 does not); `meta` says how the scores were computed.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, parse_body, registry_of, until_disconnected
from infinity_server.schemas.cohere import CohereRerankRequest


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


routes = [
    Route("/v1/rerank", rerank_v1, methods=["POST"]),
    Route("/v2/rerank", rerank_v2, methods=["POST"]),
]
