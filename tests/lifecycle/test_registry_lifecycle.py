"""The lifecycle in-process: budgets, LRU eviction, busy models, keep-alive, back-off, timeouts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pytest

from model_registry import ModelState, ModelUnavailable, Registry, SyncRegistry, UnsupportedOperation
from model_registry.adapters.fake import fake_vector, held_bytes
from model_registry.runtime.handles import EventKind
from model_registry.types import Embedding, Result
from tests.builders.lifecycle import budget_for, fake_model

T = TypeVar("T")


def run(config: dict[str, Any], scenario: Callable[[Registry], Awaitable[T]]) -> T:
    async def main() -> T:
        async with Registry.from_config(config) as registry:
            return await scenario(registry)

    return asyncio.run(main())


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for `condition` (state changed by the registry's own tasks and threads)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.01)):
        if condition() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.01)


def dense(result: Result) -> npt.NDArray[np.float32]:
    assert isinstance(result, Embedding)
    assert result.dense is not None
    return result.dense


def evicted(registry: Registry) -> list[str]:
    return [e.model for e in registry.events if e.kind == EventKind.EVICTED]


def expired(registry: Registry) -> list[str]:
    return [e.model for e in registry.events if e.kind == EventKind.EXPIRED]


def loads(registry: Registry, name: str | None = None) -> int:
    return sum(1 for e in registry.events if e.kind == EventKind.LOADED and name in (None, e.model))


def states(registry: Registry) -> dict[str, str]:
    return {info.name: info.state.value for info in registry.infos()}


def test_alternating_over_three_models_with_room_for_two_evicts_in_lru_order() -> None:
    config = {"models": [fake_model(n) for n in "abc"], "memory_budget": budget_for(2)}

    async def scenario(registry: Registry) -> None:
        for name in "abcabcab":
            result = await registry.embed(name, [f"hello {name}"])
            np.testing.assert_allclose(dense(result.items[0]), fake_vector(f"hello {name}", 8))
        # a b fill the budget; each later load evicts the one used longest ago.
        assert evicted(registry) == ["a", "b", "c", "a", "b", "c"]
        assert states(registry) == {"a": "loaded", "b": "loaded", "c": "unloaded"}
        for event in registry.events:
            if event.kind == EventKind.EVICTED:
                assert event.model == min(event.candidates, key=lambda c: c[1])[0]
        infos = {i.name: i for i in registry.infos()}
        assert infos["a"].footprint_bytes == 10 * 2**20
        assert infos["c"].footprint_bytes is None
        assert registry.memory()[0].charged == 20 * 2**20

    run(config, scenario)


def test_a_busy_model_is_never_evicted_even_when_least_recently_used() -> None:
    models = [fake_model("slow", delay=0.5), fake_model("b"), fake_model("c")]
    config = {"models": models, "memory_budget": budget_for(2)}

    async def scenario(registry: Registry) -> None:
        await registry.load("b")
        slow = asyncio.create_task(registry.embed("slow", ["long job"]))
        await until(lambda: registry.info("slow").state == ModelState.LOADED)
        await registry.embed("b", ["newer use"])  # now "slow" is the least recently used
        await registry.embed("c", ["needs room"])
        assert evicted(registry) == ["b"]
        result = await slow
        assert len(result.items) == 1
        assert states(registry) == {"slow": "loaded", "b": "unloaded", "c": "loaded"}

    run(config, scenario)


def test_no_room_says_what_was_needed_what_was_free_and_who_is_busy() -> None:
    models = [fake_model("p", pin=True), fake_model("slow", delay=0.6), fake_model("c")]
    config = {"models": models, "memory_budget": budget_for(2), "room_wait": 0}

    async def scenario(registry: Registry) -> None:
        slow = asyncio.create_task(registry.embed("slow", ["long job"]))
        await until(lambda: registry.info("slow").state == ModelState.LOADED)
        with pytest.raises(ModelUnavailable) as caught:
            await registry.embed("c", ["no room"])
        message = str(caught.value)
        assert "needs 10.0 MiB" in message
        assert "5.0 MiB is free" in message
        assert "p (pinned)" in message
        assert "slow" in message
        await slow  # in-flight work was not disturbed
        assert evicted(registry) == []
        await registry.embed("c", ["room now"])  # the slow model is idle again
        assert evicted(registry) == ["slow"]

    run(config, scenario)


def test_a_load_waits_a_moment_for_a_busy_model_to_go_idle() -> None:
    models = [fake_model("p", pin=True), fake_model("slow", delay=0.4), fake_model("c")]
    config = {"models": models, "memory_budget": budget_for(2), "room_wait": 5}

    async def scenario(registry: Registry) -> None:
        slow = asyncio.create_task(registry.embed("slow", ["long job"]))
        await until(lambda: registry.info("slow").state == ModelState.LOADED)
        await registry.embed("c", ["waits for room"])
        assert slow.done()
        assert len(slow.result().items) == 1
        assert evicted(registry) == ["slow"]

    run(config, scenario)


def test_a_model_larger_than_the_whole_budget_is_refused_without_evicting() -> None:
    config = {"models": [fake_model("a"), fake_model("huge", mib=100)], "memory_budget": budget_for(2)}

    async def scenario(registry: Registry) -> None:
        await registry.load("a")
        with pytest.raises(ModelUnavailable, match=r"'huge': it needs 100.0 MiB"):
            await registry.load("huge")
        assert states(registry)["a"] == "loaded"
        info = registry.info("huge")
        assert info.state == ModelState.UNLOADED  # not broken: it is retried on the next request
        assert info.error is not None
        assert "needs 100.0 MiB" in info.error

    run(config, scenario)


def test_pinned_models_load_at_start_and_are_never_evicted_or_unloaded() -> None:
    models = [fake_model("p", pin=True), fake_model("a"), fake_model("b")]
    config = {"models": models, "memory_budget": budget_for(2)}

    async def scenario(registry: Registry) -> None:
        assert states(registry) == {"p": "loaded", "a": "unloaded", "b": "unloaded"}
        assert registry.ready
        for name in "abab":
            await registry.embed(name, ["x"])
        assert set(evicted(registry)) == {"a", "b"}
        with pytest.raises(UnsupportedOperation, match="pinned"):
            await registry.unload("p")
        assert states(registry)["p"] == "loaded"

    run(config, scenario)


def test_fifty_concurrent_first_requests_share_one_load() -> None:
    config = {"models": [fake_model("a", load_delay=0.3)]}

    async def scenario(registry: Registry) -> None:
        calls = [registry.embed("a", [f"text {i}"]) for i in range(50)]
        loading = asyncio.gather(*calls)
        await asyncio.sleep(0.1)
        assert registry.info("a").state == ModelState.LOADING
        results = await loading
        assert len(results) == 50
        assert loads(registry, "a") == 1

    run(config, scenario)


def test_unload_waits_for_work_in_flight_and_memory_is_uncharged() -> None:
    config = {"models": [fake_model("a", delay=0.4)]}

    async def scenario(registry: Registry) -> None:
        await registry.load("a")
        job = asyncio.create_task(registry.embed("a", ["long job"]))
        await asyncio.sleep(0.1)
        info = await registry.unload("a")
        assert job.done()
        assert len(job.result().items) == 1
        assert info.state == ModelState.UNLOADED
        assert registry.memory()[0].charged == 0

    run(config, scenario)


def test_keep_alive_unloads_an_idle_model_but_not_a_pinned_one() -> None:
    models = [fake_model("brief", keep_alive=0.3), fake_model("p", pin=True, keep_alive=0.3)]

    async def scenario(registry: Registry) -> None:
        await registry.embed("brief", ["x"])
        await asyncio.sleep(0.15)
        assert registry.info("brief").state == ModelState.LOADED
        await until(lambda: bool(expired(registry)))
        assert expired(registry) == ["brief"]
        assert registry.info("brief").state == ModelState.UNLOADED
        assert registry.info("p").state == ModelState.LOADED
        await registry.embed("brief", ["back again"])  # reloads on demand
        assert loads(registry, "brief") == 2

    run({"models": models}, scenario)


def test_a_load_that_takes_too_long_fails_with_its_cause_and_is_retried_later() -> None:
    models = [fake_model("a", load_delay=0.5, allocate=True), fake_model("b")]
    config = {"models": models, "load_timeout": 0.1, "failed_retry_after": 3, "memory_budget": budget_for(1)}
    config["room_wait"] = 0

    async def scenario(registry: Registry) -> None:
        with pytest.raises(ModelUnavailable, match="loading took longer than"):
            await registry.embed("a", ["x"])
        with pytest.raises(ModelUnavailable, match="next attempt in"):
            await registry.embed("a", ["x"])
        info = registry.info("a")
        assert info.state == ModelState.FAILED
        assert info.error is not None
        assert "longer than" in info.error
        # The load's thread goes on: its memory stays charged until it has finished and is unloaded.
        assert registry.memory()[0].charged == 10 * 2**20
        with pytest.raises(ModelUnavailable, match=r"10.0 MiB is held by loads that timed out .*memory_budget"):
            await registry.embed("b", ["no room yet"])
        await until(lambda: registry.memory()[0].charged == 0)
        assert registry.memory()[0].charged == 0
        assert held_bytes() == 0
        await registry.embed("b", ["room now"])

    run(config, scenario)


def test_a_script_juggles_models_without_a_server() -> None:
    config = {"models": [fake_model(n) for n in "abc"], "memory_budget": budget_for(2)}
    with SyncRegistry.from_config(config) as registry:
        for name in "abcab":
            result = registry.embed(name, ["juggled"])
            np.testing.assert_allclose(dense(result.items[0]), fake_vector("juggled", 8))
        registry.unload("a")
        loaded = {i.name for i in registry.infos() if i.state == ModelState.LOADED}
        assert loaded == {"b"}
        assert [e.model for e in registry.registry.events if e.kind == EventKind.EVICTED] == ["a", "b", "c"]


def test_work_on_a_model_s_threads_holds_it_against_eviction() -> None:
    # Tokenizing for /tokenize, long inputs and left cuts runs on the model's prepare threads:
    # evicting the model would stop those threads and cancel the calls still queued there.
    config = {"models": [fake_model("a"), fake_model("b")], "memory_budget": budget_for(1), "room_wait": 0}
    config["prepare_threads"] = 1
    started, gate = threading.Event(), threading.Event()

    def first() -> str:
        started.set()
        gate.wait(5)
        return "first"

    async def scenario(registry: Registry) -> list[str]:
        await registry.embed("a", ["load a"])
        calls = [asyncio.create_task(registry.on_model_threads("a", first))]
        await asyncio.to_thread(started.wait, 5)
        calls.append(asyncio.create_task(registry.on_model_threads("a", lambda: "queued")))
        await asyncio.sleep(0.05)
        with pytest.raises(ModelUnavailable, match="cannot be evicted now: a"):
            await registry.embed("b", ["no room while a is in use"])
        gate.set()
        done = [await call for call in calls]
        assert evicted(registry) == []
        return done

    assert run(config, scenario) == ["first", "queued"]
