"""413 for request bodies over the configured limit, declared or streamed; 408 for bodies too slow.

A body must arrive whole within `timeout` seconds of its request's headers: Hypercorn's own
`read_timeout` bounds each read, so a client sending one byte every few seconds would hold its
connection (and a slot of the body's memory) for ever. After the 408 the connection closes: its
unread body leaves it unusable.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity_server.errors import HTTPError, error_response, shape_of

_DRAIN_BYTES = 64 * 2**20


class BodyLimit:
    """413 for a body over `limit` bytes, by Content-Length or by counting a streamed body; 408 for
    one not whole `timeout` seconds after its headers."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = 30.0, paths: Mapping[str, int] | None = None) -> None:
        # `paths`: the limit of a route that takes larger bodies (the batch file upload).
        self.app, self.default, self.timeout, self.paths = app, limit, timeout, dict(paths or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(receive, self.timeout)
        limit = self.paths.get(scope["path"], self.default)
        declared = dict(scope["headers"]).get(b"content-length")
        # bytes.isdigit is ASCII only; a length of more digits than a limit has is over it.
        if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            await self._reject(scope, body, send, limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await body()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    await self._drain(body, message)
                    raise HTTPError(413, _message(limit), code="body_too_large")
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _drain(receive: Receive, message: Message) -> None:
        """Read (and drop) the rest of a streamed body, up to `_DRAIN_BYTES`, before answering 413.

        A server that answers and closes while the client still sends makes many clients see a
        reset instead of the 413; a bounded drain lets them read the answer. A body too slow to
        drain is left unread (the connection closes after the answer).
        """
        drained = 0
        with contextlib.suppress(HTTPError):
            while message.get("more_body", False) and drained < _DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        await self._drain(receive, {"type": "http.request", "more_body": True})
        response = error_response(413, _message(limit), code="body_too_large", shape=shape_of(scope))
        await response(scope, receive, send)


def _message(limit: int) -> str:
    return f"the request body is larger than the limit of {limit:,} bytes"


class _Body:
    """A request's `receive` that raises a 408 `HTTPError` when the body is not whole `timeout`
    seconds after the request began; messages after the body (a disconnect) are not timed."""

    def __init__(self, receive: Receive, timeout: float) -> None:
        self.receive, self.timeout = receive, timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.whole = False

    async def __call__(self) -> Message:
        if self.whole:
            return await self.receive()
        try:
            message = await _before(self.receive(), self.deadline)
        except TimeoutError:
            raise HTTPError(
                408,
                f"the request body did not arrive within {self.timeout:g} s of its headers "
                "(server.body_read_timeout); send it faster, or in smaller requests",
                code="body_timeout",
            ) from None
        self.whole = message["type"] != "http.request" or not message.get("more_body", False)
        return message


if sys.version_info >= (3, 11):

    async def _before(awaitable: Awaitable[Message], deadline: float) -> Message:
        """`awaitable`'s result, or `TimeoutError` at `deadline` (the event loop's clock)."""
        async with asyncio.timeout_at(deadline):
            return await awaitable

else:  # pragma: no cover - Python 3.10

    async def _before(awaitable: Awaitable[Message], deadline: float) -> Message:
        """`awaitable`'s result, or `TimeoutError` at `deadline` (the event loop's clock)."""
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(awaitable, max(0.0, left))
        except asyncio.TimeoutError:
            raise TimeoutError from None


async def drop_unread(request: Request) -> None:
    """Read and drop what is left of `request`'s body (up to `_DRAIN_BYTES`), for a handler that
    refuses it before reading it: see `answer_unread`."""
    drained = 0
    with contextlib.suppress(HTTPError, ClientDisconnect):
        async for chunk in request.stream():
            drained += len(chunk)
            if drained >= _DRAIN_BYTES:
                return


async def answer_unread(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send `response` to a request refused before its body was read, after reading and dropping
    that body (up to `_DRAIN_BYTES`). A request whose body is still unread when its answer ends
    cannot leave the connection reusable: the server closes it, and a client that sends its next
    request on it meanwhile sees a disconnect instead of an answer."""
    with contextlib.suppress(HTTPError):  # past the body limit while dropping it: this answer still stands
        await BodyLimit._drain(receive, {"type": "http.request", "more_body": True})
    await response(scope, receive, send)
