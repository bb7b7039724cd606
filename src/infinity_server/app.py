"""create_app(settings) -> Starlette. The lifespan owns the Registry; middleware are plain ASGI.

Middleware, outermost first (each in its own module): the request's route (its operation and error
shape), request context (id, timing headers, stage metrics, spans, access log), request metrics,
the drain gate (graceful shutdown), body limit, authentication and scopes, the content type (415).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from infinity_server import batches, openapi
from infinity_server.api import admin, catalogue, cohere, encode, infinity, media, native, openai, tei, vllm
from infinity_server.api.endpoint import api_routes
from infinity_server.auth import Authenticate, keyring
from infinity_server.body_limit import BodyLimit
from infinity_server.content_type import JsonContentType
from infinity_server.errors import HTTPError, error_response, handle_exception, shape_of, to_response
from infinity_server.fetch import close_media_client
from infinity_server.metrics import Metrics, RequestMetrics
from infinity_server.request_context import RequestContext
from infinity_server.routing import Routed, operations_of
from infinity_server.settings import Settings
from infinity_server.shutdown import Drain, DrainGate
from infinity_server.tracing import Tracing
from model_registry import Registry
from model_registry.errors import RegistryError


async def _http_exception(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    status, headers = error.status_code, dict(error.headers or {})  # 405 carries `Allow`
    text = message.get(status, str(error.detail))
    return error_response(
        status, text, code=codes.get(status, "http_error"), headers=headers, shape=shape_of(request.scope)
    )


ROUTES = [
    *api_routes(
        *openai.operations,
        *native.operations,
        *infinity.operations,
        *cohere.operations,
        *encode.operations,
        *media.operations,
        *admin.operations,
        *catalogue.operations,
        *tei.operations,
        *vllm.operations,
        *batches.operations,
        *openapi.operations,
    ),
    openapi.assets,
]


def body_limits(settings: Settings) -> dict[str, int]:
    """Per path, the body limit of a route that replaces `server.max_body_bytes` (the batch file upload's)."""
    limits = {op.path: op.max_body(settings.server) for op in operations_of(ROUTES) if op.max_body is not None}
    return {path: limit for path, limit in limits.items() if limit is not None}


def create_app(settings: Settings, registry: Registry | None = None, *, tracer_provider: Any = None) -> Starlette:
    """The whole server as an ASGI app; `registry` may be given (tests), else built from settings.

    Spans go to `tracer_provider` when given, else to the global one when `server.tracing` is on.
    """
    metrics = Metrics()
    engine = registry or Registry(settings.registry, on_batch=metrics.on_batch, on_event=metrics.on_event)
    keys = keyring(settings.server)
    drain = Drain()
    metrics.in_flight.set_function(lambda: drain.inflight)
    tracing = Tracing(tracer_provider) if tracer_provider is not None or settings.server.tracing else None
    jobs = batches.Batches(settings.server, metrics.registry)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        with metrics.watching_the_collector():
            # Pinned models load in the background: the port opens at once, /health answers and
            # /ready says what is loading, whatever the ASGI server's startup timeout.
            await engine.start(wait=False)
            await jobs.start(app)  # unfinished batch jobs resume
            try:
                yield
            finally:
                await jobs.stop()
                await engine.stop()
                await close_media_client(app.state)

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        middleware=[
            Middleware(Routed, routes=ROUTES),
            Middleware(RequestContext, metrics=metrics, tracing=tracing, access_log=settings.server.access_log),
            Middleware(RequestMetrics, metrics=metrics),
            Middleware(DrainGate, drain=drain),
            Middleware(
                BodyLimit,
                limit=settings.server.max_body_bytes,
                timeout=settings.server.body_read_timeout,
                paths=body_limits(settings),
            ),
            Middleware(Authenticate, keys=keys),
            Middleware(JsonContentType),
        ],
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
    app.state.drain = drain
    app.state.batches = jobs
    return app


__all__ = ["create_app", "to_response"]
