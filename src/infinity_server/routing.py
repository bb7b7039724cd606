"""Each route declared once: an `Operation` carries what the server, its middleware and its document know of it.

A module lists its operations (`post(path, handler, summary)`, `get(...)`); the request and
response types come from the handler's signature, which mypy checks against what the handler
returns, so the API document (`openapi.py`) says what goes on the wire. A handler takes the request
and, for a route with a body, the body already read (`api/endpoint.py`): a pydantic model, the raw
JSON object (`dict[str, Any]`) or the multipart form (`FormData`); it returns its answer (written
with orjson), a `Vectors` answer (written off the event loop when large) or a `Response`.

`api.endpoint.api_routes` groups the operations by path into `ApiRoute`s (so that a 405 lists every
method of a path), and `Routed`, the outermost middleware, marks each request with its operation:
the error shape, the key's scope, the content type, the drain gate and quiet logging read it.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_server.errors import Shape
from infinity_server.settings import ServerSettings

T = TypeVar("T", covariant=True)
JSON, MULTIPART = "application/json", "multipart/form-data"
#: What a model route may answer besides 200 (see errors.py's table and the middleware).
MODEL_ERRORS = (400, 401, 403, 404, 408, 413, 415, 422, 429, 499, 500, 503, 504)
#: A route without a body or a model: a missing or wrong key, or a draining server.
PLAIN_ERRORS = (401, 403, 503)
#: The readiness route, which the gate (`gate.py`) also asks of a group's replicas.
READY_PATH = "/ready"
ADMIN_ERRORS = (400, 401, 403, 404, 499, 503, 504)
#: A batch route: a bad field (400), no such file or job, or the API off (404), a job that is over
#: (409), a file too large or no room left (413), too many jobs for the key (429).
BATCH_ERRORS = (400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)


@dataclass(frozen=True)
class Vectors(Generic[T]):
    """An answer built (quantized, encoded, dumped) on a worker thread when it holds more than
    `encoding.OFF_LOOP_NUMBERS` numbers, so that writing a large one does not stall other requests."""

    build: Callable[[], T]
    numbers: int


Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Operation:
    """One method on one path: what the router, the middleware and the API document know of it.

    `request` and `response` are the body's and the answer's types (a pydantic model, a TypedDict
    or any type pydantic describes); `shapes` are the error shapes its errors come in, the first
    one unless the handler picks another from the body; `scope` is the key scope it needs (None:
    open to anyone); `batch`: a batch job's lines may run it; `quiet`: logged at debug level
    (probes and scrapes); `while_draining`: served while the server drains; `max_body`: the body
    limit that replaces `server.max_body_bytes`, from the settings (None: the default).
    """

    method: str
    path: str
    summary: str
    handler: Handler
    request: Any = None
    response: Any = None
    errors: tuple[int, ...] = MODEL_ERRORS
    scope: str | None = "inference"
    tag: str = "inference"
    shapes: tuple[Shape, ...] = (Shape.OPENAI,)
    request_type: str = JSON
    response_type: str = JSON
    alternatives: tuple[tuple[int, Any], ...] = ()
    example: Mapping[str, Any] | None = None
    batch: bool = False
    quiet: bool = False
    while_draining: bool = False
    max_body: Callable[[ServerSettings], int | None] | None = None
    body: Any = field(default=None, compare=False)


def operation(method: str, path: str, handler: Handler, summary: str, **fields: Any) -> Operation:
    """An operation whose body and answer types are read from `handler`'s signature unless given."""
    hints = typing.get_type_hints(handler, include_extras=True)
    parameters = [name for name in hints if name != "return"]
    body = hints[parameters[1]] if len(parameters) > 1 else None
    answer = hints.get("return")
    if typing.get_origin(answer) is Vectors:
        answer = typing.get_args(answer)[0]
    declared: dict[str, Any] = {"request": _documented(body), "response": None if answer is Response else answer}
    if body is FormData:
        declared["request_type"] = MULTIPART
    return Operation(method, path, summary, handler, **{**declared, **fields, "body": body})


def _documented(body: Any) -> Any:
    """The body's type as the document gives it; a raw object or a form is described by the route."""
    return None if body is FormData or typing.get_origin(body) is dict else body


def post(path: str, handler: Handler, summary: str, **fields: Any) -> Operation:
    return operation("POST", path, handler, summary, **fields)


def get(path: str, handler: Handler, summary: str, **fields: Any) -> Operation:
    return operation("GET", path, handler, summary, **fields)


Endpoint = Callable[[Request], Awaitable[Response]]


class ApiRoute(Route):
    """A Starlette route serving every operation declared on one path, each through the endpoint
    `serve` makes of it (`api.endpoint.serve`: read the body, run the handler, write the answer)."""

    def __init__(self, operations: Sequence[Operation], serve: Callable[[Operation], Endpoint]) -> None:
        self.operations = tuple(operations)
        by_method = {op.method: serve(op) for op in self.operations}

        async def dispatch(request: Request) -> Response:
            return await by_method["GET" if request.method == "HEAD" else request.method](request)

        super().__init__(self.operations[0].path, dispatch, methods=list(by_method))


class OpenMount(Mount):
    """Files served under a path (Swagger UI's assets): open to anyone, not in the document."""

    def __init__(self, path: str, app: ASGIApp, name: str) -> None:
        super().__init__(path, app=app, name=name)
        self.operation = Operation("GET", path, name, _no_handler, scope=None, errors=())


async def _no_handler(request: Request) -> Response:
    raise AssertionError("This is a bug: a mount's operation is never called")


def operations_of(routes: Iterable[BaseRoute]) -> list[Operation]:
    """Every operation the routes serve, in order."""
    return [op for route in routes if isinstance(route, ApiRoute) for op in route.operations]


class RouteTable:
    """Finds a request's operation: by its path first (most paths hold no parameter), then by matching."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self.routes = tuple(routes)
        self.exact = {r.path: r for r in self.routes if isinstance(r, ApiRoute) and not r.param_convertors}

    def find(self, scope: Scope) -> Operation | None:
        """The operation of the request's method and path; another method's on its path (the 405
        answers in that route's shape); None when no route has the path."""
        route: BaseRoute | None = self.exact.get(scope["path"])
        if not (isinstance(route, ApiRoute) and scope["method"] in (route.methods or ())):
            route = self._routed(scope)
        if isinstance(route, OpenMount):
            return route.operation
        if not isinstance(route, ApiRoute):
            return None
        method = "GET" if scope["method"] == "HEAD" else scope["method"]
        return next((op for op in route.operations if op.method == method), route.operations[0])

    def _routed(self, scope: Scope) -> BaseRoute | None:
        """The route Starlette's router dispatches to: the first full match (path and method), else
        the first that matches the path. Any other choice lets the scope check read another route
        than the one that runs (a path's trailing newline matches more patterns than one)."""
        partial = None
        for route in self.routes:
            match = route.matches(scope)[0]
            if match == Match.FULL:
                return route
            if match == Match.PARTIAL and partial is None:
                partial = route
        return partial


def operation_in(scope: Scope) -> Operation | None:
    """The operation `Routed` found for the request (None: no route has its path)."""
    found: Operation | None = scope.get("state", {}).get("operation")
    return found


class Routed:
    """The outermost middleware: marks each request with its operation and its error shape, so
    that every refusal before the route (401, 403, 413, 415, 503) is written in the route's shape."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app, self.table = app, RouteTable(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            op = self.table.find(scope)
            state = scope.setdefault("state", {})
            state["operation"] = op
            if op is not None and op.shapes[0] != Shape.OPENAI:
                state["error_shape"] = op.shapes[0]
        await self.app(scope, receive, send)
