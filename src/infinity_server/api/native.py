"""Native routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from infinity_server.api.common import json_response, registry_of
from infinity_server.routing import PLAIN_ERRORS, READY_PATH, get
from infinity_server.schemas.responses import Health, Readiness
from model_registry import ModelState


async def health(request: Request) -> Health:
    """Liveness: the process answers. Infinity's shape."""
    return {"unix": time.time()}


async def ready(request: Request) -> Response:
    """Readiness: every pinned model loaded and its worker alive; else 503 with what is loading
    (and for how many seconds) and why a failed one failed (it is retried on its back-off). A
    draining server is not ready: 503 at once, so that the load balancer takes it out."""
    if request.app.state.drain.draining:
        draining: Readiness = {"ready": False, "draining": True}
        return json_response(draining, 503, {"Connection": "close", "Retry-After": "1"})
    registry = registry_of(request)
    infos = [i for i in registry.infos() if i.pinned]
    body: Readiness = {"ready": registry.ready, "pinned": {i.name: i.state.value for i in infos}}
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


_OPEN = {"errors": (), "scope": None, "tag": "operations"}
operations = [
    get("/health", health, "Liveness", quiet=True, while_draining=True, **_OPEN),
    get(
        READY_PATH,
        ready,
        "Readiness: models loaded, not draining",
        response=Readiness,
        alternatives=((503, Readiness),),
        quiet=True,
        while_draining=True,
        **_OPEN,
    ),
    get(
        "/metrics",
        metrics,
        "Prometheus metrics",
        response_type="text/plain; version=0.0.4",
        errors=PLAIN_ERRORS,
        scope="metrics",
        tag="operations",
        quiet=True,
        while_draining=True,
    ),
]
