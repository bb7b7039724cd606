"""vLLM's pooling dialect: score (at two paths) and pooling.

Score scores (text_1, text_2) pairs with a cross-encoder, or with an embedding model by the
cosine of the two texts' vectors (MaxSim for multi-vector models), as vLLM does. Pooling
answers a model's token vectors when it has them (ColBERT, BGE-M3, ColPali), else its vector.
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request

from infinity_server.api.common import registry_of
from infinity_server.encoding import column, encode_vectors, numbers_in, output_limit
from infinity_server.routing import Vectors, post
from infinity_server.schemas.vllm import (
    PoolingData,
    PoolingRequest,
    PoolingResponse,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    VllmUsage,
)
from model_registry import Capability, Output, UnsupportedOperation


def _usage(tokens: int) -> VllmUsage:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


async def score(request: Request, body: ScoreRequest) -> ScoreResponse:
    options = body.truncation(body.truncate)
    if "max_tokens" in options:
        raise UnsupportedOperation(
            "/score cuts a pair at the model's limit only: send truncate_prompt_tokens -1, or none",
            param="truncate_prompt_tokens",
        )
    scored = await registry_of(request).score(
        body.model, body.pairs(), truncate=options["truncate"], priority=body.priority
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


async def pooling(request: Request, body: PoolingRequest) -> Vectors[PoolingResponse]:
    registry = registry_of(request)
    tokens = Capability.MULTIVECTOR in registry.info(body.model).capabilities
    output = Output.MULTIVECTOR if tokens else Output.DENSE
    options = body.truncation(body.truncate)
    limit = output_limit(request.app.state.settings.server.max_output_bytes, "float32", body.encoding_format)
    results = await registry.embed(
        body.model, body.texts(), outputs=(output,), output_limit=limit, priority=body.priority, **options
    )

    def build() -> PoolingResponse:
        arrays = encode_vectors(column(results, output.value), "float32", body.encoding_format)
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


operations = [
    post("/score", score, "Score text pairs (vLLM)"),
    post("/v1/score", score, "Score text pairs (vLLM)"),
    post("/pooling", pooling, "Pooled or per-token output (vLLM)"),
]
