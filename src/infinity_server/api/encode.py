"""The native `POST /v1/encode`: dense, sparse and multi-vector output, any subset, in one call.

- dense: a vector per input, as floats or base64, in any embedding type;
- sparse: `{indices, values}` over the vocabulary (and `tokens` when `return_tokens`);
- multivector: a list of token vectors per input, or `{data, shape, dtype}` with base64 data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, parse_body, registry_of, until_disconnected
from infinity_server.encoding import encode_vectors
from infinity_server.schemas.encode import EncodeRequest
from model_registry.types import Embedding, Results, SparseVector


def sparse_entry(vector: SparseVector, with_tokens: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"indices": np.asarray(vector.indices, dtype=np.int64), "values": vector.values}
    if with_tokens:
        entry["tokens"] = list(vector.tokens or ())
    return entry


def _column(results: Results, name: str) -> list[Any]:
    column = []
    for result in results.items:
        value = getattr(result, name) if isinstance(result, Embedding) else None
        if value is None:
            raise TypeError(f"This is a bug: the model returned no {name} output")
        column.append(value)
    return column


def encoded_outputs(body: EncodeRequest, results: Results) -> list[dict[str, Any]]:
    """One entry per input holding the asked outputs, encoded as the request says."""
    entries: list[dict[str, Any]] = [{"object": "encoding", "index": i} for i in range(len(results.items))]
    kind, fmt = body.embedding_type, body.encoding_format
    if "dense" in body.outputs:
        for entry, vector in zip(entries, encode_vectors(_column(results, "dense"), kind, fmt), strict=True):
            entry["dense"] = vector
    if "sparse" in body.outputs:
        for entry, sparse in zip(entries, _column(results, "sparse"), strict=True):
            entry["sparse"] = sparse_entry(sparse, body.return_tokens)
    if "multivector" in body.outputs:
        matrices = _column(results, "multivector")
        for entry, matrix, data in zip(entries, matrices, encode_vectors(matrices, kind, fmt), strict=True):
            if fmt == "base64":
                entry["multivector"] = {"data": data, "shape": list(matrix.shape), "dtype": _wire_dtype(kind)}
            else:
                entry["multivector"] = data
    return entries


def _wire_dtype(embedding_type: str) -> str:
    return {"binary": "int8", "ubinary": "uint8"}.get(embedding_type, embedding_type)


async def encode(request: Request) -> Response:
    body = await parse_body(request, EncodeRequest)
    results = await until_disconnected(
        request,
        registry_of(request).embed(
            body.model,
            body.texts(),
            outputs=body.outputs,
            prompt_name=body.prompt_name,
            truncate=body.truncate,
            priority=body.priority,
        ),
    )
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response(
        {"object": "list", "model": body.model, "data": encoded_outputs(body, results), "usage": usage}
    )


routes = [Route("/v1/encode", encode, methods=["POST"])]
