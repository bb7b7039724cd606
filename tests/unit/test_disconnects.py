"""`until_disconnected`: a request's work is cancelled when its client leaves, and only then."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from starlette.requests import Request

from infinity_server.api.common import until_disconnected
from model_registry import Cancelled


class Client:
    """A request whose `receive` reports a disconnect once `leave()` is called."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()
        self.listening = False
        self.stopped_listening = False

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        self.listening = True
        try:
            await self._gone.wait()
        except asyncio.CancelledError:
            self.stopped_listening = True
            raise
        return {"type": "http.disconnect"}

    def request(self) -> Request:
        return cast(Request, self)


def current() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def leave_after(client: Client, seconds: float) -> None:
    await asyncio.sleep(seconds)
    client.leave()


async def test_the_work_s_result_comes_back_and_the_watcher_stops() -> None:
    client = Client()

    async def work() -> str:
        await asyncio.sleep(0.05)
        return "done"

    assert await until_disconnected(client.request(), work()) == "done"
    await asyncio.sleep(0)
    assert client.listening
    assert client.stopped_listening
    assert current().cancelling() == 0


async def test_a_disconnect_cancels_the_work_and_is_answered_as_cancelled() -> None:
    client = Client()
    seen: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    leaving = asyncio.create_task(leave_after(client, 0.05))
    with pytest.raises(Cancelled, match="disconnected"):
        await until_disconnected(client.request(), work())
    await leaving
    assert seen == ["cancelled"]
    # The cancellation was taken back: the handler goes on (it answers, logs, counts).
    assert current().cancelling() == 0
    await asyncio.sleep(0.01)


async def test_a_cancellation_by_the_server_stays_a_cancellation() -> None:
    client = Client()
    handler = asyncio.create_task(until_disconnected(client.request(), asyncio.sleep(30)))
    await asyncio.sleep(0.05)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert client.stopped_listening


async def test_the_server_s_cancellation_survives_a_disconnect_in_the_same_moment() -> None:
    client = Client()
    handler = asyncio.create_task(until_disconnected(client.request(), asyncio.sleep(30)))
    await asyncio.sleep(0.05)
    client.leave()
    await asyncio.sleep(0)  # the watcher sees the disconnect and cancels the handler
    handler.cancel()  # and the server (a shutdown) cancels it too
    with pytest.raises(asyncio.CancelledError):
        await handler


async def test_work_that_finishes_despite_the_disconnect_leaves_no_cancellation_behind() -> None:
    client = Client()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    leaving = asyncio.create_task(leave_after(client, 0.05))
    assert await until_disconnected(client.request(), stubborn()) == "finished anyway"
    await leaving
    assert current().cancelling() == 0
    await asyncio.sleep(0.01)
