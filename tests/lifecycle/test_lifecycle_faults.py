"""Lifecycle faults: failed and timed-out loads, unloads that raise, work for an unloaded model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from model_registry import InvalidInput, ModelState, ModelUnavailable, Overloaded, Registry
from model_registry.adapters.fake import held_bytes
from model_registry.runtime.handles import EventKind
from model_registry.types import ClassifyItem
from tests.builders.lifecycle import fake_model
from tests.unit.test_registry import forward_started, traffic_only


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether `condition` (changed by the registry's own tasks and threads) holds within `timeout`."""
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def test_a_failed_load_gives_back_what_it_loaded_and_its_charge() -> None:
    before = held_bytes()
    config = {"models": [fake_model("broken", 32, allocate=True, load_error="weights are corrupt")]}
    async with Registry.from_config(config) as registry:
        with pytest.raises(ModelUnavailable, match="weights are corrupt"):
            await registry.embed("broken", ["x"])
        assert registry.info("broken").state == ModelState.FAILED
        assert registry.memory()[0].charged == 0
        assert held_bytes() == before


async def test_the_keep_alive_task_survives_an_unload_that_raises(caplog: pytest.LogCaptureFixture) -> None:
    models = [fake_model("flaky", keep_alive=0.1, unload_errors=1), fake_model("steady", keep_alive=0.1)]
    async with Registry.from_config({"models": models}) as registry:
        await registry.embed("flaky", ["x"])
        assert await until(lambda: "expiring the idle model 'flaky' failed" in caplog.text)
        await registry.embed("steady", ["y"])
        assert await until(lambda: any(e.model == "steady" and e.kind == EventKind.EXPIRED for e in registry.events))


async def test_work_for_a_model_unloaded_under_it_fails_at_once_with_unavailable() -> None:
    config = {"models": [fake_model("slow", delay=0.4)], "request_timeout": 30}
    async with Registry.from_config(config) as registry:
        await registry.load("slow")  # the schedule below is the batches', not the load's
        adapter = traffic_only(registry, "slow")
        running = asyncio.create_task(registry.embed("slow", ["running"]))
        await forward_started(adapter)  # unloading waits for the batch running, and fails the others
        prefetched = asyncio.create_task(registry.embed("slow", ["prefetched"]))
        await asyncio.sleep(0.05)
        queued = asyncio.create_task(registry.embed("slow", ["queued"]))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await registry._lifecycle.unload(registry._handles["slow"])
        for task in (prefetched, queued):
            with pytest.raises(ModelUnavailable, match="unloaded"):
                await task
        assert time.monotonic() - started < 2.0  # not at the 30 s deadline
        await running
        assert registry._handles["slow"].inflight == 0


async def test_the_lease_is_released_however_a_request_ends() -> None:
    config = {"models": [fake_model("m", delay=0.2, max_queued_items=4)], "max_inputs_per_request": 4}
    async with Registry.from_config(config) as registry:
        handle = registry._handles["m"]
        with pytest.raises(InvalidInput, match="embeds text only"):  # raised by the prepare stage
            await registry.run("m", [ClassifyItem("not an embedding")])
        task = asyncio.create_task(registry.embed("m", ["cancelled"]))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Overloaded):
            await asyncio.gather(*(registry.embed("m", ["w"] * 4) for _ in range(4)))
        assert await until(lambda: handle.inflight == 0)
        assert await until(lambda: handle.backlog is not None and handle.backlog.cost == 0)
        assert handle.evictable
