"""What every route shares: body parsing, fast JSON responses, disconnect-aware execution."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from infinity_server.errors import HTTPError
from model_registry import Registry
from model_registry.errors import Cancelled

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def registry_of(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body validated into `model`; malformed JSON or a wrong shape is a 422."""
    body = await request.body()
    if not body:
        raise HTTPError(422, "the request body is empty; a JSON object is expected", code="invalid_body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise HTTPError(422, f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise HTTPError(422, "the request body must be a JSON object", code="invalid_body")
    return allowed_priority(request, model.model_validate(data))


def allowed_priority(request: Request, body: M) -> M:
    """`body` with the priority its caller may have (the engine's policy; see docs/reliability.md)."""
    asked = getattr(body, "priority", None)
    if asked is None:
        return body
    granted = "priority" in request.scope.get("state", {}).get("scopes", frozenset())
    return body.model_copy(update={"priority": registry_of(request).client_priority(asked, granted=granted)})


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson with numpy support: float32 arrays are written without a Python float per value."""
    return Response(orjson.dumps(content, option=_JSON_OPTIONS), status, headers, media_type="application/json")


def encode_vector(vector: np.ndarray, encoding_format: str) -> Any:
    """float32 as a JSON array, or base64 of little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (its queued items are dropped)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise Cancelled("the client disconnected before the request finished")
