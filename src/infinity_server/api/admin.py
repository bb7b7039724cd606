"""Model control: load and unload by name, and where the memory budget goes.

`POST /v1/models/{name}/load` loads a model now (evicting idle ones if it must; a failed model is
retried at once) and `POST /v1/models/{name}/unload` unloads it once its work in flight is done.
Both answer the model's `/models` entry; a model that cannot load answers 503 with the cause.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response, registry_of
from infinity_server.api.openai import model_entry
from model_registry import LifecycleEvent

_RECENT_EVENTS = 200


async def load(request: Request) -> Response:
    info = await registry_of(request).load(request.path_params["name"])
    return json_response(model_entry(info))


async def unload(request: Request) -> Response:
    info = await registry_of(request).unload(request.path_params["name"])
    return json_response(model_entry(info))


def event_entry(event: LifecycleEvent) -> dict[str, Any]:
    return {
        "kind": event.kind.value,
        "model": event.model,
        "device": event.device,
        "bytes": event.bytes,
        "at": event.at,
        "seconds": round(event.seconds, 4),
        "reason": event.reason or None,
        "candidates": [{"model": name, "lru_stamp": stamp} for name, stamp in event.candidates],
    }


async def memory(request: Request) -> Response:
    """Each device's budget and what is charged to it, and the latest lifecycle events."""
    registry = registry_of(request)
    devices = [{"device": u.device, "budget_bytes": u.budget, "charged_bytes": u.charged} for u in registry.memory()]
    events = [event_entry(e) for e in registry.events[-_RECENT_EVENTS:]]
    return json_response({"devices": devices, "events": events})


routes = [
    Route("/v1/models/{name:model}/load", load, methods=["POST"]),
    Route("/v1/models/{name:model}/unload", unload, methods=["POST"]),
    Route("/v1/memory", memory, methods=["GET"]),
]
