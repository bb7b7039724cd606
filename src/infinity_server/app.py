"""create_app(settings) -> Starlette. The lifespan owns the Registry; middleware are plain ASGI."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity_server.api import admin, cohere, encode, infinity, media, native, openai
from infinity_server.errors import HTTPError, error_response, handle_exception, to_response
from infinity_server.metrics import Metrics
from infinity_server.settings import Settings
from model_registry import Registry
from model_registry.admission import arrival
from model_registry.errors import RegistryError

_OPEN_PATHS = frozenset({"/health", "/ready"})
_DRAIN_BYTES = 64 * 2**20


class BodyLimit:
    """413 for a body over `limit` bytes, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    await self._drain(receive, message)
                    raise HTTPError(413, self._message(), code="body_too_large")
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _drain(receive: Receive, message: Message) -> None:
        """Read (and drop) the rest of a streamed body, up to `_DRAIN_BYTES`, before answering 413.

        A server that answers and closes while the client still sends makes many clients see a
        reset instead of the 413; a bounded drain lets them read the answer.
        """
        drained = 0
        while message.get("more_body", False) and drained < _DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))

    def _message(self) -> str:
        return f"the request body is larger than the limit of {self.limit:,} bytes"

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._drain(receive, {"type": "http.request", "more_body": True})
        response = error_response(413, self._message(), code="body_too_large")
        await response(scope, receive, send)


class ApiKey:
    """401 unless `Authorization: Bearer <key>` matches; liveness and readiness stay open."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), self.key):
            response = error_response(401, "a valid API key is required (Authorization: Bearer ...)", code="bad_key")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RequestMetrics:
    """Counts requests by route template and status, and their latency."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 500
        arrival.set(time.monotonic())  # the request's deadline counts from here

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", "unmatched")
            self.metrics.requests.labels(name, str(status)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - started)


async def _http_exception(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    status = error.status_code
    return error_response(status, message.get(status, str(error.detail)), code=codes.get(status, "http_error"))


def create_app(settings: Settings, registry: Registry | None = None) -> Starlette:
    """The whole server as an ASGI app; `registry` may be given (tests), else built from settings."""
    metrics = Metrics()
    engine = registry or Registry(settings.registry, on_batch=metrics.on_batch, on_event=metrics.on_event)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = Starlette(
        routes=[
            *openai.routes,
            *native.routes,
            *infinity.routes,
            *cohere.routes,
            *encode.routes,
            *media.routes,
            *admin.routes,
        ],
        lifespan=lifespan,
        exception_handlers={
            HTTPError: handle_exception,
            RegistryError: handle_exception,
            ValidationError: handle_exception,
            HTTPException: _http_exception,
            Exception: handle_exception,
        },
    )
    app.state.registry = engine
    app.state.metrics = metrics
    app.state.settings = settings
    app.add_middleware(ApiKey, key=settings.server.api_key)
    app.add_middleware(BodyLimit, limit=settings.server.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


__all__ = ["create_app", "to_response"]
