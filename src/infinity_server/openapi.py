"""The API document (OpenAPI 3.1) at `GET /openapi.json`, and Swagger UI at `GET /docs`.

The document is built from one table, `OPERATIONS`: per route its method, path, summary,
request and response models (pydantic, from `infinity_server.schemas`) and error statuses.
A route the app serves without a line here fails `tests/integration/test_openapi.py`. Every error
is `ErrorResponse` (OpenAI's shape). Swagger UI is served from the packaged `openapi-ui-bundles`
assets, so the page works offline.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Literal

from openapi_ui_bundles import swagger_ui
from pydantic import BaseModel, RootModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from infinity_server.api.catalogue import CatalogueList
from infinity_server.api.common import json_response
from infinity_server.batches import schemas as jobs
from infinity_server.schemas import responses as out
from infinity_server.schemas import tei, vllm
from infinity_server.schemas.cohere import CohereEmbedRequest, CohereEmbedResponse, CohereRerankRequest
from infinity_server.schemas.encode import EncodeRequest
from infinity_server.schemas.infinity import ClassifyRequest, RerankRequest
from infinity_server.schemas.media import MediaEmbeddingRequest, MediaRerankRequest
from infinity_server.schemas.openai import EmbeddingRequest, InfinityEmbeddingRequest

Scope = Literal["inference", "admin", "metrics"] | None

#: What a model route may answer besides 200 (see errors.py's table and the middleware).
MODEL_ERRORS = (400, 401, 403, 404, 408, 413, 415, 422, 429, 499, 500, 503, 504)
#: A route without a body or a model: a missing or wrong key, or a draining server.
PLAIN_ERRORS = (401, 403, 503)
ADMIN_ERRORS = (400, 401, 403, 404, 499, 503, 504)
#: A batch route: a bad field (400), no such file or job, or the API off (404), a job that is over
#: (409), a file too large or no room left (413), too many jobs for the key (429).
BATCH_ERRORS = (400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)
_MULTIPART = "multipart/form-data"
_PROMETHEUS = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class Operation:
    """One route in the document."""

    method: str
    path: str
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = out.EmbeddingResponse
    errors: tuple[int, ...] = MODEL_ERRORS
    scope: Scope = "inference"
    tag: str = "inference"
    request_type: str = "application/json"
    response_type: str = "application/json"
    # Other success-like answers with their own body (readiness's 503).
    alternatives: tuple[tuple[int, type[BaseModel]], ...] = ()
    error: type[BaseModel] = out.ErrorResponse


def model_op(
    method: str, path: str, summary: str, request: type[BaseModel] | None, response: type[BaseModel]
) -> Operation:
    """A model route: JSON in (validated by `request`), `response` out, the model errors."""
    return Operation(method, path, summary, request, response)


def form_op(path: str, summary: str, form: type[BaseModel], response: type[BaseModel]) -> Operation:
    """A multipart/form-data upload route; `form` describes its fields."""
    return Operation("POST", path, summary, form, response, request_type=_MULTIPART)


def admin_op(method: str, path: str, summary: str, response: type[BaseModel]) -> Operation:
    """An admin route: the `admin` scope, 404 while admin routes are off."""
    return Operation(method, path, summary, None, response, ADMIN_ERRORS, "admin", "admin")


def open_op(
    path: str, summary: str, response: type[BaseModel] | None, media_type: str = "application/json"
) -> Operation:
    """An operations route anyone may call (`GET`)."""
    return Operation("GET", path, summary, None, response, (), None, "operations", response_type=media_type)


def batch_op(method: str, path: str, summary: str, response: type[BaseModel] | None, **fields: Any) -> Operation:
    """A route of the batch API (files and jobs): `inference` scope, the batch errors."""
    return replace(Operation(method, path, summary, None, response, BATCH_ERRORS, tag="batches"), **fields)


def tei_op(path: str, summary: str, request: type[BaseModel] | None, response: type[BaseModel]) -> Operation:
    """A TEI route: errors in TEI's shape `{"error", "error_type"}`."""
    method = "GET" if request is None else "POST"
    return Operation(method, path, summary, request, response, error=tei.TeiError)


class RerankEitherRequest(RootModel[RerankRequest | tei.TeiRerankRequest]):
    """`POST /rerank`: Infinity's body (`documents`) or TEI's (`texts`); a body with both is a 422."""


class RerankEitherResponse(RootModel[out.RerankResponse | tei.TeiRerankResponse]):
    """Infinity's answer to Infinity's body, TEI's bare list to TEI's."""


class EitherError(RootModel[out.ErrorResponse | tei.TeiError]):
    """OpenAI's error shape, or TEI's when the body was TEI's."""


_E, _LIST, _IMAGES = out.EmbeddingResponse, out.ModelList, out.ImageRerankResponse
_READY_503 = ((503, out.Readiness),)  # readiness answers 503 with its own body
#: One line per route. A route the app serves without a line here fails the tests.
OPERATIONS: tuple[Operation, ...] = (
    model_op("POST", "/v1/embeddings", "Embeddings (OpenAI; text, image or audio)", EmbeddingRequest, _E),
    model_op("POST", "/embeddings", "Embeddings (Infinity's unversioned path)", InfinityEmbeddingRequest, _E),
    Operation("GET", "/v1/models", "The configured models and their state", None, _LIST, PLAIN_ERRORS),
    Operation("GET", "/v1/models/{name}", "One model and its state", None, out.ModelEntry, (*PLAIN_ERRORS, 404)),
    Operation("GET", "/v1/catalogue", "Known published models and their records", None, CatalogueList, PLAIN_ERRORS),
    Operation("GET", "/models", "The configured models (unversioned path)", None, _LIST, PLAIN_ERRORS),
    replace(
        model_op("POST", "/rerank", "Rerank (Infinity's or TEI's body)", RerankEitherRequest, RerankEitherResponse),
        error=EitherError,
    ),
    model_op("POST", "/classify", "Classify texts (Infinity)", ClassifyRequest, out.ClassifyResponse),
    model_op("POST", "/v1/rerank", "Rerank (Cohere v1)", CohereRerankRequest, out.CohereRerankResponse),
    model_op("POST", "/v2/rerank", "Rerank (Cohere v2)", CohereRerankRequest, out.CohereRerankResponse),
    model_op("POST", "/v1/embed", "Embed (Cohere v1)", CohereEmbedRequest, CohereEmbedResponse),
    model_op("POST", "/v2/embed", "Embed (Cohere v2; text and image inputs)", CohereEmbedRequest, CohereEmbedResponse),
    tei_op("/embed", "Dense vectors (TEI)", tei.TeiEmbedRequest, tei.TeiEmbedResponse),
    tei_op("/embed_sparse", "Sparse vectors (TEI)", tei.TeiEmbedRequest, tei.TeiSparseResponse),
    tei_op("/embed_all", "Per-token vectors (TEI)", tei.TeiEmbedRequest, tei.TeiEmbedAllResponse),
    tei_op("/predict", "Classify texts or pairs (TEI)", tei.TeiPredictRequest, tei.TeiPredictResponse),
    tei_op("/similarity", "Sentence similarity (TEI)", tei.TeiSimilarityRequest, tei.TeiSimilarityResponse),
    tei_op("/tokenize", "Tokens of each input (TEI)", tei.TeiTokenizeRequest, tei.TeiTokenizeResponse),
    tei_op("/decode", "Texts of token ids (TEI)", tei.TeiDecodeRequest, tei.TeiDecodeResponse),
    tei_op("/info", "The default model (TEI)", None, tei.TeiInfo),
    tei_op("/", "The route of the model's kind (TEI)", tei.TeiRootRequest, tei.TeiRootResponse),
    tei_op("/models/{name}", "The route of the named model's kind (TEI)", tei.TeiRootRequest, tei.TeiRootResponse),
    model_op("POST", "/score", "Score text pairs (vLLM)", vllm.ScoreRequest, vllm.ScoreResponse),
    model_op("POST", "/v1/score", "Score text pairs (vLLM)", vllm.ScoreRequest, vllm.ScoreResponse),
    model_op("POST", "/pooling", "Pooled or per-token output (vLLM)", vllm.PoolingRequest, vllm.PoolingResponse),
    model_op("POST", "/v1/encode", "Dense, sparse and multi-vector output", EncodeRequest, out.EncodeResponse),
    model_op("POST", "/embeddings_image", "Image embeddings from URLs or data URIs", MediaEmbeddingRequest, _E),
    model_op("POST", "/embeddings_audio", "Audio embeddings from URLs or data URIs", MediaEmbeddingRequest, _E),
    form_op("/v1/embeddings/upload", "Embeddings of uploaded files", out.EmbeddingUpload, _E),
    model_op("POST", "/v1/rerank/images", "Rank images against a query", MediaRerankRequest, _IMAGES),
    form_op("/v1/rerank/images/upload", "Rank uploaded images", out.ImageRerankUpload, _IMAGES),
    batch_op(
        "POST",
        "/v1/files",
        "Upload a batch's requests (JSONL)",
        jobs.FileObject,
        request=jobs.FileUpload,
        request_type=_MULTIPART,
    ),
    batch_op("GET", "/v1/files", "The key's files, newest first", jobs.FileList),
    batch_op("GET", "/v1/files/{file_id}", "One file", jobs.FileObject),
    batch_op("DELETE", "/v1/files/{file_id}", "Delete a file", jobs.FileDeleted),
    batch_op("GET", "/v1/files/{file_id}/content", "A file's bytes (JSONL)", None, response_type="application/jsonl"),
    batch_op(
        "POST", "/v1/batches", "Run a file of requests as a job", jobs.BatchObject, request=jobs.BatchCreateRequest
    ),
    batch_op("GET", "/v1/batches", "The key's jobs, newest first", jobs.BatchList),
    batch_op("GET", "/v1/batches/{batch_id}", "One job: status, counts, result files", jobs.BatchObject),
    batch_op("POST", "/v1/batches/{batch_id}/cancel", "Cancel a job", jobs.BatchObject),
    admin_op("POST", "/v1/models/{name}/load", "Load a model now", out.ModelEntry),
    admin_op("POST", "/v1/models/{name}/unload", "Unload a model", out.ModelEntry),
    admin_op("GET", "/v1/memory", "Memory budget per device and recent lifecycle events", out.MemoryResponse),
    open_op("/health", "Liveness", out.Health),
    replace(open_op("/ready", "Readiness: models loaded, not draining", out.Readiness), alternatives=_READY_503),
    replace(open_op("/metrics", "Prometheus metrics", None, _PROMETHEUS), errors=PLAIN_ERRORS, scope="metrics"),
    open_op("/openapi.json", "This document", None),
    open_op("/docs", "Swagger UI for this document", None, "text/html"),
)

_MODEL = "all-MiniLM-L6-v2"  # the bundled model, served when no model is configured
_QUERY = {"model": _MODEL, "query": "what is a vector database", "documents": ["an index of vectors", "a cake"]}
#: One example body per JSON route with a model (Swagger UI's "Try it out", the fuzzer's first cases).
EXAMPLES: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"model": _MODEL, "input": ["a sentence to embed"]},
    "/embeddings": {"model": _MODEL, "input": ["a sentence to embed"]},
    "/rerank": {**_QUERY, "return_documents": True},
    "/classify": {"model": _MODEL, "input": ["great product"]},
    "/v1/rerank": {**_QUERY, "top_n": 1},
    "/v2/rerank": {**_QUERY, "top_n": 1},
    "/v1/encode": {"model": _MODEL, "input": ["a sentence"], "outputs": ["dense"]},
}

_PATH_PARAMETER = re.compile(r"{(\w+)(?::\w+)?}")


def document_path(route_path: str) -> str:
    """`/v1/models/{name:model}/load` -> `/v1/models/{name}/load`."""
    return _PATH_PARAMETER.sub(r"{\1}", route_path)


def _schemas(operations: tuple[Operation, ...]) -> tuple[dict[str, str], dict[str, Any]]:
    """Each model's `$ref` and the components: requests as validated, responses as written."""
    wanted: dict[tuple[type[BaseModel], Literal["validation", "serialization"]], None] = {}
    for op in operations:
        if op.request is not None:
            wanted[(op.request, "validation")] = None
        for model in (op.response, *(m for _, m in op.alternatives)):
            if model is not None:
                wanted[(model, "serialization")] = None
        wanted[(op.error, "serialization")] = None
    keys, definitions = models_json_schema(list(wanted), ref_template="#/components/schemas/{model}")
    refs = {f"{model.__name__}:{mode}": schema["$ref"] for (model, mode), schema in keys.items()}
    return refs, definitions.get("$defs", {})


def _content(media_type: str, ref: str | None) -> dict[str, Any]:
    if ref is None:
        schema: dict[str, Any] = {"type": "string"} if not media_type.startswith("application/json") else {}
        return {media_type: {"schema": schema}}
    return {media_type: {"schema": {"$ref": ref}}}


def _operation(op: Operation, refs: Mapping[str, str]) -> dict[str, Any]:
    error = refs[f"{op.error.__name__}:serialization"]
    response_ref = refs[f"{op.response.__name__}:serialization"] if op.response else None
    responses: dict[str, Any] = {"200": {"description": "OK", "content": _content(op.response_type, response_ref)}}
    for status, model in op.alternatives:
        ref = refs[f"{model.__name__}:serialization"]
        responses[str(status)] = {
            "description": HTTPStatus(status).phrase,
            "content": _content("application/json", ref),
        }
    for status in op.errors:
        phrase = "Client Closed Request" if status == 499 else HTTPStatus(status).phrase
        responses.setdefault(str(status), {"description": phrase, "content": _content("application/json", error)})
    entry: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "responses": responses}
    entry["operationId"] = f"{op.method.lower()}_{re.sub(r'[^a-z0-9]+', '_', op.path.lower()).strip('_')}"
    if op.request is not None:
        ref = refs[f"{op.request.__name__}:validation"]
        entry["requestBody"] = {"required": True, "content": _content(op.request_type, ref)}
        if op.path in EXAMPLES:
            entry["requestBody"]["content"][op.request_type]["example"] = EXAMPLES[op.path]
    parameters = _PATH_PARAMETER.findall(op.path)
    if parameters:
        entry["parameters"] = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in parameters
        ]
    entry["security"] = [{"bearer": []}] if op.scope else []
    if op.scope:
        entry["description"] = f"Needs a key with the `{op.scope}` scope when keys are configured."
    return entry


def _version() -> str:
    try:
        return importlib.metadata.version("infinity-server")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def build_document(operations: tuple[Operation, ...] = OPERATIONS) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations`."""
    refs, definitions = _schemas(operations)
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "infinity-server",
            "version": _version(),
            "description": "Embeddings, rerank and classification for retrieval; see docs/operations.md.",
        },
        "paths": paths,
        "components": {"schemas": definitions, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


async def openapi_json(request: Request) -> Response:
    return json_response(build_document())


_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infinity-server API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css"></head>
<body><div id="ui"></div><script src="docs/assets/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script></body></html>
"""


async def docs(request: Request) -> Response:
    return HTMLResponse(_DOCS_PAGE)


routes = [
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs, methods=["GET"]),
    Mount("/docs/assets", StaticFiles(directory=swagger_ui.static_path), name="docs-assets"),
]
