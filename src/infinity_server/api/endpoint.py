"""How an operation's handler runs: its body read and validated, its work cancelled when the client
leaves, its answer written. One place for what every route did by hand (vLLM's `with_cancellation`)."""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from infinity_server.api.common import json_response, parse_body, read_object, read_uploads, until_disconnected
from infinity_server.encoding import dump_json
from infinity_server.routing import JSON, ApiRoute, Endpoint, Operation, Vectors
from infinity_server.schemas.common import Body


def serve(op: Operation) -> Endpoint:
    """The Starlette endpoint of `op`: read the body, run the handler (under `until_disconnected`
    when it has a body: a client that leaves cancels its queued work), write its answer."""
    read = _reader(op.body)

    async def run(request: Request) -> Response:
        if read is None:
            return await answer(await op.handler(request))
        body = await read(request)
        try:
            result = await until_disconnected(request, op.handler(request, body))
        finally:
            if isinstance(body, FormData):
                await body.close()
        return await answer(result)

    return run


def _reader(body: Any) -> Callable[[Request], Awaitable[Any]] | None:
    """How to read a body of the type a handler takes (None: it takes none)."""
    if body is None:
        return None
    if body is FormData:
        return read_uploads
    if typing.get_origin(body) is dict:
        return read_object
    if isinstance(body, type) and issubclass(body, Body):
        model: type[Body] = body

        async def parse(request: Request) -> Body:
            return await parse_body(request, model)

        return parse
    raise TypeError(f"This is a bug: a handler's body must be a schemas.common.Body, a dict or FormData, not {body!r}")


async def answer(result: Any) -> Response:
    """A handler's result as a response: a `Response` as it is, `Vectors` dumped off the loop when large."""
    if isinstance(result, Response):
        return result
    if isinstance(result, Vectors):
        return Response(await dump_json(result.build, result.numbers), media_type=JSON)
    return json_response(result)


def api_routes(*operations: Operation) -> list[ApiRoute]:
    """One route per path, its operations in declaration order."""
    paths: dict[str, list[Operation]] = {}
    for op in operations:
        paths.setdefault(op.path, []).append(op)
    return [ApiRoute(ops, serve) for ops in paths.values()]
