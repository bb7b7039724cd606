"""Native routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, registry_of


async def health(request: Request) -> Response:
    """Liveness: the process answers. Infinity's shape."""
    return json_response({"unix": time.time()})


async def ready(request: Request) -> Response:
    """Readiness: every pinned model loaded and its worker alive."""
    registry = registry_of(request)
    pinned = {i.name: i.state.value for i in registry.infos() if i.pinned}
    status = 200 if registry.ready else 503
    return json_response({"ready": registry.ready, "pinned": pinned}, status=status)


async def metrics(request: Request) -> Response:
    body = request.app.state.metrics.exposition(registry_of(request))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
