"""Infinity's dialect beyond embeddings: rerank (whose path it shares with TEI's) and classify."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request

from infinity_server.api.common import registry_of
from infinity_server.routing import post
from infinity_server.schemas.infinity import ClassifyRequest, RerankRequest
from infinity_server.schemas.responses import ClassifyResponse, RerankResponse, RerankResult
from model_registry import Ranking, RerankCall


def ranking_results(ranking: Ranking, return_documents: bool) -> list[RerankResult]:
    results: list[RerankResult] = []
    for r in ranking.results:
        result: RerankResult = {
            "relevance_score": r.score,
            "index": r.index,
            "document": r.document if return_documents else None,
        }
        if r.parts is not None:
            result["parts"] = dict(r.parts)
        results.append(result)
    return results


async def rerank(request: Request, body: RerankRequest) -> RerankResponse:
    """Infinity's rerank body; the route, shared with TEI's body, is declared in the TEI module."""
    ranking = await registry_of(request).rerank_call(
        RerankCall(
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
        )
    )
    return {
        "object": "rerank",
        "id": f"rerank-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": body.model,
        "results": ranking_results(ranking, body.return_documents),
        "usage": {"prompt_tokens": ranking.tokens, "total_tokens": ranking.tokens},
        "meta": {"scoring_method": ranking.method},
    }


async def classify(request: Request, body: ClassifyRequest) -> ClassifyResponse:
    result = await registry_of(request).classify(
        body.model, body.texts(), raw_scores=body.raw_scores, truncate=body.truncate, priority=body.priority
    )
    return {
        "object": "classify",
        "id": f"classify-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": body.model,
        "data": [[{"label": s.label, "score": s.score} for s in row] for row in result.results],
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
    }


_EXAMPLE = {"model": "all-MiniLM-L6-v2", "input": ["great product"]}
operations = [post("/classify", classify, "Classify texts (Infinity)", batch=True, example=_EXAMPLE)]
