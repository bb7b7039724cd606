"""The one table from errors to HTTP status and JSON body.

Every route answers errors in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import logging
import math

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

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


def error_response(
    status: int, message: str, *, code: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
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


def to_response(error: Exception) -> Response:
    if isinstance(error, HTTPError):
        return error_response(error.status, error.message, code=error.code, param=error.param)
    if isinstance(error, ValidationError):
        message, param = validation_message(error)
        return error_response(422, message, code="invalid_body", param=param)
    if isinstance(error, RegistryError):
        for cls, status, code in TABLE:
            if isinstance(error, cls):
                headers = None
                if isinstance(error, Overloaded):
                    headers = {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
                return error_response(status, error.message, code=code, param=error.param, headers=headers)
        return error_response(500, error.message, code="registry_error", param=error.param)
    log.exception("This is a bug: an unexpected error reached the HTTP edge", exc_info=error)
    return error_response(500, f"internal error ({type(error).__name__}); this is a bug", code="internal_error")


async def handle_exception(request: Request, error: Exception) -> Response:
    return to_response(error)
