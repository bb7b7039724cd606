"""Model control: load and unload by name, and where the memory budget goes.

Load loads a model now (evicting idle ones if it must; a failed model is retried at once) and
unload unloads it once its work in flight is done.
Both answer the model's `/models` entry; a model that cannot load answers 503 with the cause.
"""

from __future__ import annotations

from starlette.requests import Request

from infinity_server.api.common import registry_of
from infinity_server.api.openai import model_entry
from infinity_server.routing import ADMIN_ERRORS, get, post
from infinity_server.schemas.responses import DeviceMemory, LifecycleEventEntry, MemoryResponse, ModelEntry
from model_registry import LifecycleEvent

_RECENT_EVENTS = 200


async def load(request: Request) -> ModelEntry:
    return model_entry(await registry_of(request).load(request.path_params["name"]))


async def unload(request: Request) -> ModelEntry:
    return model_entry(await registry_of(request).unload(request.path_params["name"]))


def event_entry(event: LifecycleEvent) -> LifecycleEventEntry:
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


async def memory(request: Request) -> MemoryResponse:
    """Each device's budget and what is charged to it, and the latest lifecycle events."""
    registry = registry_of(request)
    devices: list[DeviceMemory] = [
        {"device": u.device, "budget_bytes": u.budget, "charged_bytes": u.charged} for u in registry.memory()
    ]
    events = [event_entry(e) for e in registry.events[-_RECENT_EVENTS:]]
    return {"devices": devices, "events": events}


_ADMIN = {"errors": ADMIN_ERRORS, "scope": "admin", "tag": "admin"}
operations = [
    post("/v1/models/{name:model}/load", load, "Load a model now", **_ADMIN),
    post("/v1/models/{name:model}/unload", unload, "Unload a model", **_ADMIN),
    get("/v1/memory", memory, "Memory budget per device and recent lifecycle events", **_ADMIN),
]
