"""Infinity's dialect beyond embeddings: `POST /rerank` and `POST /classify`."""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, parse_body, registry_of, until_disconnected
from infinity_server.schemas.infinity import ClassifyRequest, RerankRequest
from model_registry import Ranking


def ranking_results(ranking: Ranking, return_documents: bool) -> list[dict[str, Any]]:
    return [
        {
            "relevance_score": r.score,
            "index": r.index,
            "document": r.document if return_documents else None,
            **({"parts": dict(r.parts)} if r.parts is not None else {}),
        }
        for r in ranking.results
    ]


async def rerank(request: Request) -> Response:
    body = await parse_body(request, RerankRequest)
    ranking = await until_disconnected(
        request,
        registry_of(request).rerank(
            body.model,
            body.query,
            body.documents,
            top_n=body.top_n,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            instruction=body.instruction,
            weights=body.weights.model_dump() if body.weights is not None else None,
            return_parts=body.return_parts,
            priority=body.priority,
        ),
    )
    return json_response(
        {
            "object": "rerank",
            "id": f"rerank-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": body.model,
            "results": ranking_results(ranking, body.return_documents),
            "usage": {"prompt_tokens": ranking.tokens, "total_tokens": ranking.tokens},
            "meta": {"scoring_method": ranking.method},
        }
    )


async def classify(request: Request) -> Response:
    body = await parse_body(request, ClassifyRequest)
    result = await until_disconnected(
        request,
        registry_of(request).classify(
            body.model, body.texts(), raw_scores=body.raw_scores, truncate=body.truncate, priority=body.priority
        ),
    )
    data = [[{"label": s.label, "score": s.score} for s in row] for row in result.results]
    return json_response(
        {
            "object": "classify",
            "id": f"classify-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": body.model,
            "data": data,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        }
    )


routes = [
    # POST /rerank is served by the TEI module, which tells the two shapes apart by the body.
    Route("/classify", classify, methods=["POST"]),
]
