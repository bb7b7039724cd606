"""One line of a batch: read from the input file, run through its route in-process, written out.

A line runs through the very route an interactive request to its `url` reaches (the same body
schema, registry call and answer, byte for byte), called in-process below the HTTP middleware, at
the lowest priority whatever the line asks, so that interactive requests are served first.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import Message, Scope

from infinity_server.api.common import ENGINE_PRIORITY
from infinity_server.batches.store import LineResult
from infinity_server.errors import error_response, shape_of, to_response
from infinity_server.routing import operations_of

#: Every line's priority, in the engine's terms (higher runs first): the lowest class, below any
#: interactive request.
LOWEST_PRIORITY = -100


@dataclass(frozen=True)
class Line:
    """A well-formed line: its number in the file (from 1), its id, and the route's body."""

    number: int
    custom_id: str
    url: str
    body: bytes


@dataclass(frozen=True)
class Answer:
    """The route's answer: status, raw JSON body, and Retry-After seconds when it gave one."""

    status: int
    body: bytes
    retry_after: float | None = None


def parse(number: int, raw: bytes, endpoint: str, endpoints: Sequence[str], max_bytes: int) -> Line | LineResult:
    """The line as a request of the batch's `endpoint`, or its failure when malformed (400) or
    larger than a request's body may be over HTTP (413, `server.max_body_bytes`); `endpoints` are
    the routes a batch may run."""
    if len(raw) > max_bytes:
        message = (
            f"line {number} is {len(raw):,} bytes, more than a request's body may be ({max_bytes:,}, "
            "server.max_body_bytes): split its inputs over several lines"
        )
        return LineResult(number, None, 413, bytes(error_response(413, message, code="body_too_large").body))
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return failed(number, None, f"line {number} is not valid JSON: {error}", "body")
    if not isinstance(data, dict):
        return failed(number, None, f"line {number} must be a JSON object", "body")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return failed(number, None, f"line {number} needs a custom_id (a non-empty string)", "custom_id")
    problem = _problem(data, endpoint, endpoints)
    if problem is not None:
        return failed(number, custom_id, f"line {number}: {problem[0]}", problem[1])
    # The line's own priority is dropped, whatever its dialect's sign: the dispatch sets the
    # engine's priority (LOWEST_PRIORITY) beside the body.
    body = {k: v for k, v in data["body"].items() if k != "priority"}
    return Line(number, custom_id, endpoint, orjson.dumps(body))


def _problem(data: dict[str, Any], endpoint: str, endpoints: Sequence[str]) -> tuple[str, str] | None:
    """What is wrong with a line's method, url or body, and the field at fault."""
    if data.get("method") != "POST":
        return f"method must be POST, got {data.get('method')!r}", "method"
    url = data.get("url")
    if url not in endpoints:
        return f"url {url!r} is not a route a batch runs; accepted: {', '.join(endpoints)}", "url"
    if url != endpoint:
        return f"url {url!r} differs from the batch's endpoint {endpoint!r}; a batch runs one route", "url"
    if not isinstance(data.get("body"), dict):
        return "body must be a JSON object (the route's request body)", "body"
    return None


def failed(number: int, custom_id: str | None, message: str, param: str) -> LineResult:
    body = error_response(400, message, code="invalid_batch_line", param=param).body
    return LineResult(number, custom_id, 400, bytes(body))


def line_id(job_id: str, number: int) -> str:
    """A line's id in the output files, the same on every run of the job."""
    return "batch_req_" + hashlib.sha256(f"{job_id}:{number}".encode()).hexdigest()[:24]


def output_line(job_id: str, result: LineResult) -> bytes:
    """OpenAI's output line, with the route's answer spliced in as it was written."""
    head = orjson.dumps({"id": line_id(job_id, result.line), "custom_id": result.custom_id})
    error = b"null" if 200 <= result.status < 300 else orjson.dumps(_error_of(result.body))
    response = b'{"status_code":%d,"body":%b}' % (result.status, result.body)
    return b'%b,"response":%b,"error":%b}\n' % (head[:-1], response, error)


def _error_of(body: bytes) -> dict[str, Any]:
    """`{code, message}` of an error body in OpenAI's shape or in TEI's."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return {"code": "invalid_response", "message": body.decode(errors="replace")}
    if isinstance(error, dict):
        return {"code": error.get("code"), "message": error.get("message")}
    return {"code": orjson.loads(body).get("error_type"), "message": error}


class Dispatch:
    """Runs a line through the app's router with the app's error handlers, below the middleware
    (no access log line, request metric or drain gate per line: the job is the request)."""

    def __init__(self, app: Starlette) -> None:
        handlers = {key: value for key, value in app.exception_handlers.items() if key not in (500, Exception)}
        self.app, self.routes = app, ExceptionMiddleware(app.router, handlers=handlers)
        #: The routes a batch may run, as `endpoint` and each line's `url` name them.
        self.endpoints = tuple(op.path for op in operations_of(app.routes) if op.batch)
        #: A line runs below the body-limit middleware: it is held to the same limit here.
        self.max_body: int = app.state.settings.server.max_body_bytes

    async def __call__(self, line: Line, owner: str, request_id: str) -> Answer:
        state = {
            "scopes": frozenset({"inference"}),
            "key_name": owner or None,
            "request_id": request_id,
            ENGINE_PRIORITY: LOWEST_PRIORITY,
        }
        scope: Scope = {
            **_SCOPE,
            "path": line.url,
            "raw_path": line.url.encode(),
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(line.body))],
            "app": self.app,
            "state": state,
        }
        messages = [{"type": "http.request", "body": line.body, "more_body": False}]
        status, chunks, retry_after = 500, [], None

        async def receive() -> Message:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # no disconnect: the line ends by its answer or its cancellation
            raise AssertionError("This is a bug: an event nobody sets was set")

        async def send(message: Message) -> None:
            nonlocal status, retry_after
            if message["type"] == "http.response.start":
                status = message["status"]
                retry_after = _retry_after(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.routes(scope, receive, send)
        except Exception as error:  # as the app's outermost handler answers it
            chunks.clear()
            await to_response(error, shape_of(scope))(scope, receive, send)
        return Answer(status, b"".join(chunks), retry_after)


_SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "query_string": b"",
    "root_path": "",
    "client": None,
    "server": None,
}


def _retry_after(headers: Any) -> float | None:
    for name, value in headers:
        if name.lower() == b"retry-after" and value.isdigit():
            return float(value)
    return None
