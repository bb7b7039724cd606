"""Native routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, registry_of
from model_registry import ModelState


async def health(request: Request) -> Response:
    """Liveness: the process answers. Infinity's shape."""
    return json_response({"unix": time.time()})


async def ready(request: Request) -> Response:
    """Readiness: every pinned model loaded and its worker alive; else 503 with what is loading
    (and for how many seconds) and why a failed one failed (it is retried on its back-off)."""
    registry = registry_of(request)
    infos = [i for i in registry.infos() if i.pinned]
    body: dict[str, Any] = {"ready": registry.ready, "pinned": {i.name: i.state.value for i in infos}}
    loading = {i.name: round(i.loading_seconds, 1) for i in infos if i.loading_seconds is not None}
    errors = {i.name: i.error for i in infos if i.error and i.state != ModelState.LOADED}
    if loading:
        body["loading_seconds"] = loading
    if errors:
        body["errors"] = errors
    return json_response(body, status=200 if registry.ready else 503)


async def metrics(request: Request) -> Response:
    body = request.app.state.metrics.exposition(registry_of(request))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
