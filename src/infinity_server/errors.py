"""The one table from errors to HTTP status and JSON body.

Every route answers errors in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`,
except the routes of Text Embeddings Inference's dialect, which answer in TEI's own shape
`{"error": "...", "error_type": "Validation" | "Overloaded" | "Unhealthy" | "Backend"}`: each route
declares its shape (`routing.Operation.shapes`). The status is the same in both: the table below
decides it once.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from model_registry.errors import (
    BatchFailed,
    Cancelled,
    DeadlineExceeded,
    InputTooLong,
    InvalidInput,
    ModelUnavailable,
    Overloaded,
    RegistryError,
    UnknownModel,
    UnsupportedOperation,
)

log = logging.getLogger(__name__)


class HTTPError(Exception):
    """An error decided at the HTTP edge (bad body, bad key, too large)."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


#: domain error -> (status, code); the first matching class wins, so subclasses come first.
TABLE: tuple[tuple[type[RegistryError], int, str], ...] = (
    (InputTooLong, 400, "input_too_long"),
    (InvalidInput, 400, "invalid_input"),
    (UnsupportedOperation, 400, "unsupported_operation"),
    (UnknownModel, 404, "model_not_found"),
    (Overloaded, 429, "overloaded"),
    (ModelUnavailable, 503, "model_unavailable"),
    (DeadlineExceeded, 504, "deadline_exceeded"),
    (Cancelled, 499, "cancelled"),
    (BatchFailed, 500, "model_error"),
)


def _type_for(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


class Shape(str, enum.Enum):
    """The error body a dialect's clients expect."""

    OPENAI = "openai"
    TEI = "tei"


def shape_of(scope: Mapping[str, Any]) -> Shape:
    """The error shape the request's route declares (`routing.Routed` marks it), OpenAI's by default."""
    shape: Shape = scope.get("state", {}).get("error_shape", Shape.OPENAI)
    return shape


def answer_in(scope: Scope, shape: Shape) -> None:
    """Write the request's errors from here on in `shape`: a route serving two dialects' bodies
    chooses once it has read which one it was given."""
    scope.setdefault("state", {})["error_shape"] = shape


def _tei_type(status: int) -> str:
    """TEI's `error_type` names (its router's `ErrorType`)."""
    return {429: "Overloaded", 503: "Unhealthy"}.get(status, "Backend" if status >= 500 else "Validation")


def error_response(
    status: int,
    message: str,
    *,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    shape: Shape = Shape.OPENAI,
) -> Response:
    body: dict[str, object]
    if shape == Shape.TEI:
        body = {"error": message, "error_type": _tei_type(status)}
    else:
        body = {"error": {"message": message, "type": _type_for(status), "param": param, "code": code}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def validation_message(error: ValidationError) -> tuple[str, str | None]:
    """A one-line account of the first problems in a request body, and the field at fault."""
    problems = error.errors(include_url=False)
    parts = []
    for problem in problems[:3]:
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        parts.append(f"{where}: {problem['msg']}")
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    param = str(problems[0]["loc"][0]) if problems and problems[0]["loc"] else None
    return "; ".join(parts) + more, param


def to_response(error: Exception, shape: Shape = Shape.OPENAI) -> Response:
    if isinstance(error, HTTPError):
        return error_response(error.status, error.message, code=error.code, param=error.param, shape=shape)
    if isinstance(error, ValidationError):
        message, param = validation_message(error)
        return error_response(422, message, code="invalid_body", param=param, shape=shape)
    if isinstance(error, RegistryError):
        for cls, status, code in TABLE:
            if isinstance(error, cls):
                headers = None
                if isinstance(error, Overloaded):
                    headers = {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
                return error_response(status, error.message, code=code, param=error.param, headers=headers, shape=shape)
        return error_response(500, error.message, code="registry_error", param=error.param, shape=shape)
    log.exception("This is a bug: an unexpected error reached the HTTP edge", exc_info=error)
    message = f"internal error ({type(error).__name__}); this is a bug"
    return error_response(500, message, code="internal_error", shape=shape)


async def handle_exception(request: Request, error: Exception) -> Response:
    return to_response(error, shape_of(request.scope))
