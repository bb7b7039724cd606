"""vLLM's pooling dialect: `POST /score` (and `/v1/score`) and `POST /pooling`.

`/score` scores (text_1, text_2) pairs with a cross-encoder, or with an embedding model by the
cosine of the two texts' vectors (MaxSim for multi-vector models), as vLLM does. `/pooling`
answers a model's token vectors when it has them (ColBERT, BGE-M3, ColPali), else its vector.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, parse_body, registry_of, until_disconnected, vectors_response
from infinity_server.encoding import column, encode_vectors, numbers_in, output_limit
from infinity_server.schemas.vllm import PoolingRequest, ScoreRequest
from model_registry import Capability, Output, UnsupportedOperation


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


async def score(request: Request) -> Response:
    body = await parse_body(request, ScoreRequest)
    options = body.truncation(body.truncate)
    if "max_tokens" in options:
        raise UnsupportedOperation(
            "/score cuts a pair at the model's limit only: send truncate_prompt_tokens -1, or none",
            param="truncate_prompt_tokens",
        )
    work = registry_of(request).score(body.model, body.pairs(), truncate=options["truncate"], priority=body.priority)
    scored = await until_disconnected(request, work)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scored.scores)]
    return json_response(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": body.model,
            "data": data,
            "usage": _usage(scored.tokens),
        }
    )


async def pooling(request: Request) -> Response:
    body = await parse_body(request, PoolingRequest)
    registry = registry_of(request)
    tokens = Capability.MULTIVECTOR in registry.info(body.model).capabilities
    output = Output.MULTIVECTOR if tokens else Output.DENSE
    options = body.truncation(body.truncate)
    limit = output_limit(request.app.state.settings.server.max_output_bytes, "float32", body.encoding_format)
    work = registry.embed(
        body.model, body.texts(), outputs=(output,), output_limit=limit, priority=body.priority, **options
    )
    results = await until_disconnected(request, work)

    def build() -> dict[str, Any]:
        arrays = encode_vectors(column(results, output.value), "float32", body.encoding_format)
        data = [{"index": i, "object": "pooling", "data": a} for i, a in enumerate(arrays)]
        return {
            "id": f"pool-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": body.model,
            "data": data,
            "usage": _usage(results.tokens),
        }

    return await vectors_response(build, numbers_in(results))


routes = [
    Route("/score", score, methods=["POST"]),
    Route("/v1/score", score, methods=["POST"]),
    Route("/pooling", pooling, methods=["POST"]),
]
