"""Every dialect route of the app has request and response schemas, and they give a JSON schema."""

from __future__ import annotations

import pydantic
from starlette.routing import Route

from infinity_server.app import create_app
from infinity_server.schemas.routes import DIALECT_ROUTES
from infinity_server.settings import load_settings

#: Routes outside the dialects (liveness, metrics, model control) are described elsewhere.
_NOT_DIALECT = {"/health", "/ready", "/metrics", "/v1/models/{name}/load", "/v1/models/{name}/unload", "/v1/memory"}


def test_every_dialect_route_has_a_schema_entry() -> None:
    app = create_app(load_settings(None, environ={}))
    served = {
        (method, route.path.replace("{name:path}", "{name}"))
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    }
    described = {(r.method, r.path) for r in DIALECT_ROUTES}
    missing = {(m, p) for m, p in served if p not in _NOT_DIALECT} - described
    assert not missing, f"routes without request/response schemas: {sorted(missing)}"
    assert not described - served, f"schemas for routes the app does not serve: {sorted(described - served)}"


def test_each_schema_renders_as_json_schema() -> None:
    for route in DIALECT_ROUTES:
        for model in (route.request, route.response):
            if model is not None:
                assert pydantic.TypeAdapter(model).json_schema(), route
