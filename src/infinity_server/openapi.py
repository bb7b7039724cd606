"""The API document (OpenAPI 3.1) at `GET /openapi.json`, and Swagger UI at `GET /docs`.

The document is built by walking the app's routes: each `routing.Operation` gives its method,
path, summary, request and response types (the types its handler is annotated with, described by
pydantic), error statuses and error shape, so the document says what the handlers write. Swagger UI
is served from the packaged `openapi-ui-bundles` assets, so the page works offline.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, Literal

from openapi_ui_bundles import swagger_ui
from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles

from infinity_server.api.common import json_response
from infinity_server.errors import Shape
from infinity_server.routing import OpenMount, Operation, get, operations_of
from infinity_server.schemas.responses import EitherError, ErrorResponse, TeiError

Mode = Literal["validation", "serialization"]
#: The body of an error, by the shapes a route's errors come in.
ERROR_TYPES: dict[tuple[Shape, ...], Any] = {
    (Shape.OPENAI,): ErrorResponse,
    (Shape.TEI,): TeiError,
    (Shape.OPENAI, Shape.TEI): EitherError,
}

_PATH_PARAMETER = re.compile(r"{(\w+)(?::\w+)?}")


def document_path(route_path: str) -> str:
    """`/v1/models/{name:model}/load` -> `/v1/models/{name}/load`."""
    return _PATH_PARAMETER.sub(r"{\1}", route_path)


def error_type(op: Operation) -> Any:
    """The type of `op`'s error bodies, from the shapes it declares."""
    return ERROR_TYPES[op.shapes]


def _wanted(op: Operation) -> list[tuple[str, Mode, Any]]:
    """The types `op` needs described: the body as validated, the answers as written."""
    found: list[tuple[str, Mode, Any]] = [("error", "serialization", error_type(op))]
    if op.request is not None:
        found.append(("request", "validation", op.request))
    if op.response is not None:
        found.append(("response", "serialization", op.response))
    found.extend((str(status), "serialization", kind) for status, kind in op.alternatives)
    return found


def _schemas(operations: Sequence[Operation]) -> tuple[list[dict[str, dict[str, Any]]], dict[str, Any]]:
    """Per operation, the schema of each of its types (a `$ref` for a named one), and the components."""
    inputs = [
        ((n, role), mode, TypeAdapter(kind)) for n, op in enumerate(operations) for role, mode, kind in _wanted(op)
    ]
    schemas, definitions = TypeAdapter.json_schemas(inputs, ref_template="#/components/schemas/{model}")
    found: list[dict[str, dict[str, Any]]] = [{} for _ in operations]
    for ((n, role), _), schema in schemas.items():
        found[n][role] = schema
    return found, definitions.get("$defs", {})


def _content(media_type: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        schema = {"type": "string"} if not media_type.startswith("application/json") else {}
    return {media_type: {"schema": schema}}


def _responses(op: Operation, schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": _content(op.response_type, schemas.get("response"))}
    }
    for status, _ in op.alternatives:
        content = _content("application/json", schemas[str(status)])
        responses[str(status)] = {"description": HTTPStatus(status).phrase, "content": content}
    for status in op.errors:
        phrase = "Client Closed Request" if status == 499 else HTTPStatus(status).phrase
        error = {"description": phrase, "content": _content("application/json", schemas["error"])}
        responses.setdefault(str(status), error)
    return responses


def _operation(op: Operation, schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    path = document_path(op.path)
    entry: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "responses": _responses(op, schemas)}
    entry["operationId"] = f"{op.method.lower()}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}"
    if op.request is not None:
        entry["requestBody"] = {"required": True, "content": _content(op.request_type, schemas["request"])}
        if op.example is not None:
            entry["requestBody"]["content"][op.request_type]["example"] = dict(op.example)
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


def build_document(operations: Sequence[Operation]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations`."""
    schemas, definitions = _schemas(operations)
    paths: dict[str, dict[str, Any]] = {}
    for op, found in zip(operations, schemas, strict=True):
        paths.setdefault(document_path(op.path), {})[op.method.lower()] = _operation(op, found)
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
    """The document of the app's routes, built at the first request and kept."""
    state = request.app.state
    if getattr(state, "openapi_document", None) is None:
        state.openapi_document = json_response(build_document(operations_of(request.app.routes))).body
    return Response(state.openapi_document, media_type="application/json")


_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infinity-server API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css"></head>
<body><div id="ui"></div><script src="docs/assets/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script></body></html>
"""


async def docs(request: Request) -> Response:
    return HTMLResponse(_DOCS_PAGE)


_OPEN = {"errors": (), "scope": None, "tag": "operations"}
operations = [
    get("/openapi.json", openapi_json, "This document", response=dict[str, Any], **_OPEN),
    get("/docs", docs, "Swagger UI for this document", response_type="text/html", **_OPEN),
]
assets = OpenMount("/docs/assets", StaticFiles(directory=swagger_ui.static_path), name="docs-assets")
