"""Graceful shutdown: drain in-flight requests before the server stops.

On SIGTERM the server keeps listening but drains: `/ready` answers 503 at once (so the load
balancer takes the pod out), every new request but `/health` and `/metrics` answers 503
`shutting_down` with `Connection: close`, and requests already running finish. When none is left,
or `server.graceful_timeout` seconds have passed, the server stops and the process exits 0; a
request still running at the end of the grace is cancelled (its queued work dropped) and answered
503 `shutting_down`, so a client can retry it elsewhere. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity_server.body_limit import answer_unread
from infinity_server.errors import error_response, shape_of
from infinity_server.routing import operation_in

log = logging.getLogger(__name__)


class Drain:
    """Whether the server is draining, and how many requests are in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.expired = False
        self._idle = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def begin(self) -> None:
        if not self.draining:
            log.info("draining: %d request(s) in flight; new requests get 503", self.inflight)
        self.draining = True
        if self.inflight == 0:
            self._idle.set()

    async def wait(self, timeout: float) -> bool:
        """Wait until no request is in flight (True) or `timeout` seconds pass (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("drain: %d request(s) still in flight after %gs; cancelling them", self.inflight, timeout)
            self.cut()
            return False
        return True

    def cut(self) -> None:
        """Cancel every request still in flight; each answers 503 if it had not answered yet."""
        self.expired = True
        for task in list(self._tasks):
            task.cancel()

    def enter(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        self._idle.clear()

    def leave(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not self._tasks and self.draining:
            self._idle.set()


class DrainGate:
    """ASGI middleware: counts requests in flight and turns new ones away while draining."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        op = operation_in(scope) if scope["type"] == "http" else None
        if scope["type"] != "http" or (op is not None and op.while_draining):
            # Liveness (a draining pod is alive), readiness (it answers 503 itself) and scrapes.
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            headers = {"Connection": "close", "Retry-After": "1"}
            message = "the server is shutting down; retry the request on another replica"
            response = error_response(503, message, code="shutting_down", headers=headers, shape=shape_of(scope))
            await answer_unread(response, scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        task, answered = asyncio.current_task(), False
        assert task is not None, "This is a bug: an ASGI request outside a task"

        async def tracking(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        self.drain.enter(task)
        try:
            await self.app(scope, receive, tracking)
        except asyncio.CancelledError:
            if not self.drain.expired or answered:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancellation was ours and is handled
                task.uncancel()
            message = "the server shut down before this request finished; retry it on another replica"
            await error_response(
                503, message, code="shutting_down", headers={"Connection": "close"}, shape=shape_of(scope)
            )(scope, receive, send)
        finally:
            self.drain.leave(task)


async def drain_on(signalled: asyncio.Event, drain: Drain, grace: float, stop: asyncio.Event) -> None:
    """The server's shutdown trigger: after the first signal drain for up to `grace` seconds.

    `stop` is set by a second signal, which ends the drain at once.
    """
    await signalled.wait()
    drain.begin()
    waiting = asyncio.ensure_future(drain.wait(grace))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    stopping.cancel()
    if drain.inflight:
        drain.cut()
        await asyncio.sleep(0)  # let the cancelled requests answer before the server closes
