"""The native encode route: dense, sparse and multi-vector output, any subset, in one call.

- dense: a vector per input, as floats or base64, in any embedding type;
- sparse: `{indices, values}` over the vocabulary (and `tokens` when `return_tokens`);
- multivector: a list of token vectors per input, or `{data, shape, dtype}` with base64 data.

Inputs are texts, or with `modality: image | audio` URLs or data URIs, so a JSON client gets
ColPali page multi-vectors without a multipart upload; a PDF among the images is embedded page by
page for a page model, each page's entry naming its `input` and `page`.
"""

from __future__ import annotations

from starlette.requests import Request

from infinity_server.api.common import document_pages, engine_inputs, paged, registry_of
from infinity_server.encoding import column, encode_vectors, numbers_in, output_limit, sparse_entry
from infinity_server.routing import Vectors, post
from infinity_server.schemas.encode import EncodeRequest
from infinity_server.schemas.responses import EncodeResponse, Encoding, Usage
from model_registry import EmbedCall, Results


def encoded_outputs(body: EncodeRequest, results: Results) -> list[Encoding]:
    """One entry per input holding the asked outputs, encoded as the request says."""
    entries: list[Encoding] = [{"object": "encoding", "index": i} for i in range(len(results.items))]
    kind, fmt = body.embedding_type, body.encoding_format
    if "dense" in body.outputs:
        for entry, vector in zip(entries, encode_vectors(column(results, "dense"), kind, fmt), strict=True):
            entry["dense"] = vector
    if "sparse" in body.outputs:
        for entry, sparse in zip(entries, column(results, "sparse"), strict=True):
            entry["sparse"] = sparse_entry(sparse, body.return_tokens)
    if "multivector" in body.outputs:
        matrices = column(results, "multivector")
        for entry, matrix, data in zip(entries, matrices, encode_vectors(matrices, kind, fmt), strict=True):
            if fmt == "base64":
                entry["multivector"] = {"data": data, "shape": list(matrix.shape), "dtype": _wire_dtype(kind)}
            else:
                entry["multivector"] = data
    return entries


def _wire_dtype(embedding_type: str) -> str:
    return {"binary": "int8", "ubinary": "uint8"}.get(embedding_type, embedding_type)


async def encode(request: Request, body: EncodeRequest) -> Vectors[EncodeResponse]:
    limit = request.app.state.settings.server.max_output_bytes
    registry = registry_of(request)
    async with engine_inputs(request, body.model, body.modality, body.texts(), body.media_inputs) as given:
        inputs, origins = (
            await document_pages(registry, body.model, given) if body.modality == "image" else (given, None)
        )
        results = await registry.embed_call(
            EmbedCall(
                body.model,
                inputs,
                outputs=body.outputs,
                prompt_name=body.prompt_name,
                task=body.chosen_adapter(),
                truncate=body.truncate,
                output_limit=output_limit(limit, body.embedding_type, body.encoding_format),
                priority=body.priority,
            )
        )
    usage: Usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}

    def answer() -> EncodeResponse:
        response: EncodeResponse = {
            "object": "list",
            "model": body.model,
            "data": encoded_outputs(body, results),
            "usage": usage,
        }
        return response if origins is None else paged(response, origins)

    return Vectors(answer, numbers_in(results))


_EXAMPLE = {"model": "all-MiniLM-L6-v2", "input": ["a sentence"], "outputs": ["dense"]}
operations = [
    post("/v1/encode", encode, "Dense, sparse and multi-vector output", batch=True, example=_EXAMPLE),
]
