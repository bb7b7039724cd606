"""vLLM's pooling dialect: score (at two paths), rerank and pooling.

Score scores (text_1, text_2) pairs with a cross-encoder, or with an embedding model by the
cosine of the two texts' vectors (MaxSim for multi-vector models), as vLLM does, whatever
similarity function the model declares. Rerank ranks documents the same way in vLLM's (Jina's)
shape; its paths are Cohere's too, and `rerank_body` tells the two bodies apart (the routes are
declared in the Cohere module). Pooling answers a model's token vectors when it has them
(ColBERT, BGE-M3, ColPali), else its vector.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from infinity_server.api.common import registry_of
from infinity_server.encoding import column, dense_vectors, encode_vectors, numbers_in, output_limit
from infinity_server.errors import HTTPError
from infinity_server.routing import Vectors, post
from infinity_server.schemas.common import Body, fields_only_in
from infinity_server.schemas.vllm import (
    PoolingData,
    PoolingRequest,
    PoolingResponse,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    VllmOptions,
    VllmRerankRequest,
    VllmRerankResponse,
    VllmRerankResult,
    VllmUsage,
)
from model_registry import (
    Capability,
    EmbedCall,
    InvalidInput,
    Output,
    RerankCall,
    Similarity,
    UnsupportedOperation,
)


def _usage(tokens: int) -> VllmUsage:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None}


def _pair_truncation(body: VllmOptions, path: str) -> tuple[bool | None, str]:
    """Whether and on which side a pair is cut: at the model's limit only, the query kept whole
    (vLLM's `k` counts the pair's tokens together, which the engine does not cut to)."""
    options = body.truncation(body.truncate)
    if "max_tokens" in options:
        raise UnsupportedOperation(
            f"{path} cuts a pair at the model's limit only: send truncate_prompt_tokens -1, or none",
            param="truncate_prompt_tokens",
        )
    return options["truncate"], options.get("truncation_direction", "right")


async def score(request: Request, body: ScoreRequest) -> ScoreResponse:
    body.refuse_unserved()
    truncate, direction = _pair_truncation(body, request.url.path)
    scored = await registry_of(request).score(
        body.model,
        body.pairs(),
        raw_scores=body.raw_scores(),
        truncate=truncate,
        truncation_direction=direction,
        priority=body.priority,
    )
    data: list[ScoreData] = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scored.scores)]
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": body.model,
        "data": data,
        "usage": _usage(scored.tokens),
    }


def rerank_body(data: Mapping[str, Any], other: type[Body]) -> bool:
    """Whether a rerank body on a path vLLM shares with `other`'s dialect is vLLM's: it sets a field
    only vLLM's rerank has. A body without one is `other`'s; one with fields of both is a 422."""
    ours = fields_only_in(data, VllmRerankRequest, other)
    if not ours:
        return False
    theirs = fields_only_in(data, other, VllmRerankRequest)
    if theirs:
        raise HTTPError(
            422,
            f"the body mixes vLLM's rerank fields ({', '.join(ours)}) with fields vLLM's rerank does not take "
            f"({', '.join(theirs)}); send one dialect's body (docs/dialects/vllm.md#rerank)",
            code="invalid_body",
            param=ours[0],
        )
    return True


async def rerank(request: Request, body: VllmRerankRequest) -> VllmRerankResponse:
    """vLLM's answer: every result carries its document, best first, at most `top_n` (0: all)."""
    body.refuse_unserved()
    truncate, direction = _pair_truncation(body, request.url.path)
    ranking = await registry_of(request).rerank_call(
        RerankCall(
            body.model,
            body.query,
            body.documents,
            top_n=body.top_n if body.top_n > 0 else None,
            raw_scores=body.raw_scores(),
            truncate=truncate,
            truncation_direction=direction,
            similarity=Similarity.COSINE,  # vLLM's rerank scores embeddings by cosine, whatever the model declares
            priority=body.priority,
        )
    )
    results: list[VllmRerankResult] = [
        {"index": r.index, "document": {"text": r.document, "multi_modal": None}, "relevance_score": r.score}
        for r in ranking.results
    ]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": body.model,
        "usage": {"prompt_tokens": ranking.tokens, "total_tokens": ranking.tokens},
        "results": results,
    }


async def pooling(request: Request, body: PoolingRequest) -> Vectors[PoolingResponse]:
    body.refuse_unserved()
    registry = registry_of(request)
    output = _pooling_output(body, Capability.MULTIVECTOR in registry.info(body.model).capabilities)
    options = body.truncation(body.truncate)
    limit = output_limit(request.app.state.settings.server.max_output_bytes, "float32", body.encoding_format)
    results = await registry.embed_call(
        EmbedCall(
            body.model,
            body.inputs(),
            outputs=(output,),
            output_limit=limit,
            priority=body.priority,
            dimensions=body.dimensions,
            **options,
        )
    )
    # Whether a model normalises is known once it is loaded, as it is now.
    if body.use_activation is False and registry.info(body.model).extra.get("normalize") is not False:
        raise UnsupportedOperation(
            f"use_activation: false asks for vectors before normalisation, and '{body.model}' normalises "
            "its own output",
            param="use_activation",
        )

    def build() -> PoolingResponse:
        vectors = dense_vectors(results) if output == Output.DENSE else column(results, "multivector")
        arrays = encode_vectors(vectors, "float32", body.encoding_format)
        data: list[PoolingData] = [{"index": i, "object": "pooling", "data": a} for i, a in enumerate(arrays)]
        return {
            "id": f"pool-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": body.model,
            "data": data,
            "usage": _usage(results.tokens),
        }

    return Vectors(build, numbers_in(results))


def _pooling_output(body: PoolingRequest, has_tokens: bool) -> Output:
    """vLLM's task: "embed" the pooled vector, "token_embed" token vectors; unset, token vectors
    when the model has them. `dimensions` cuts pooled vectors only."""
    tokens = body.task == "token_embed" or (body.task is None and has_tokens)
    if tokens and body.dimensions is not None:
        raise InvalidInput("dimensions cuts a pooled vector; this request answers token vectors", param="dimensions")
    return Output.MULTIVECTOR if tokens else Output.DENSE


operations = [
    post("/score", score, "Score text pairs (vLLM)"),
    post("/v1/score", score, "Score text pairs (vLLM)"),
    post("/pooling", pooling, "Pooled or per-token output (vLLM)"),
]
