"""413 for request bodies over the configured limit, declared or streamed."""

from __future__ import annotations

import contextlib

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity_server.errors import HTTPError, error_response, shape_of

_DRAIN_BYTES = 64 * 2**20


class BodyLimit:
    """413 for a body over `limit` bytes, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    await self._drain(receive, message)
                    raise HTTPError(413, self._message(), code="body_too_large")
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _drain(receive: Receive, message: Message) -> None:
        """Read (and drop) the rest of a streamed body, up to `_DRAIN_BYTES`, before answering 413.

        A server that answers and closes while the client still sends makes many clients see a
        reset instead of the 413; a bounded drain lets them read the answer.
        """
        drained = 0
        while message.get("more_body", False) and drained < _DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))

    def _message(self) -> str:
        return f"the request body is larger than the limit of {self.limit:,} bytes"

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._drain(receive, {"type": "http.request", "more_body": True})
        response = error_response(413, self._message(), code="body_too_large", shape=shape_of(scope))
        await response(scope, receive, send)


async def answer_unread(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send `response` to a request refused before its body was read, after reading and dropping
    that body (up to `_DRAIN_BYTES`). A request whose body is still unread when its answer ends
    cannot leave the connection reusable: the server closes it, and a client that sends its next
    request on it meanwhile sees a disconnect instead of an answer."""
    with contextlib.suppress(HTTPError):  # past the body limit while dropping it: this answer still stands
        await BodyLimit._drain(receive, {"type": "http.request", "more_body": True})
    await response(scope, receive, send)
