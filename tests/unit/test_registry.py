"""The registry with the fake adapter: ordering, failure isolation, cancellation, deadlines, bounds."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import pytest

from model_registry import (
    BatchFailed,
    DeadlineExceeded,
    InvalidInput,
    ModelUnavailable,
    Overloaded,
    Registry,
    SyncRegistry,
    UnknownModel,
)
from model_registry.adapters import Adapter
from model_registry.adapters.fake import FakeAdapter, fake_vector
from model_registry.runtime import worker as worker_module
from model_registry.runtime.worker import INLINE_COST, PrepareStage
from model_registry.types import Embedding, EmbedItem, Media, Modality, Text
from tests.waiting import eventually_async


def fake(name: str = "fake", **options: Any) -> dict[str, Any]:
    return {"name": name, "source": "fake", "kind": "fake", "pin": True, "options": options}


def adapter_of(registry: Registry, name: str) -> FakeAdapter:
    adapter = registry._handles[name].adapter
    assert isinstance(adapter, FakeAdapter)
    return adapter


def traffic_only(registry: Registry, name: str) -> FakeAdapter:
    """The model's adapter with the batches its load timed (for admission) forgotten: what the
    test counts from here on are the batches its own requests make."""
    adapter = adapter_of(registry, name)
    adapter.batches.clear()
    return adapter


T = TypeVar("T")


async def until(read: Callable[[], T], accept: Callable[[T], bool] = bool) -> T:
    """`read()` once `accept` holds for it: state the worker's threads change, polled from the loop."""

    async def reading() -> T:
        return read()

    return await eventually_async(reading, accept)


async def forward_started(adapter: FakeAdapter, passes: int = 1) -> None:
    """Wait until `passes` forward passes have begun on `adapter` (each is recorded as it begins)."""
    await until(lambda: len(adapter.batches), lambda begun: begun >= passes)


def collated_ahead(registry: Registry, name: str) -> bool:
    """Whether the model's collator holds a batch, collated, for the forward pass after this one."""
    worker = registry._handles[name].worker
    return worker is not None and worker._handoff.full()


def vectors(results: Any) -> list[np.ndarray]:
    return [r.dense for r in results.items if isinstance(r, Embedding) and r.dense is not None]


def collating_threads(adapter: FakeAdapter) -> list[str]:
    """The names of the threads that collate `adapter`'s batches, from now on, in order."""
    threads: list[str] = []
    original = adapter.collate

    def collate(items: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(items)

    adapter.collate = collate  # type: ignore[method-assign]
    return threads


async def test_results_come_back_in_input_order_across_batches() -> None:
    texts = [" ".join(["w"] * n) + f" {n}" for n in (5, 1, 9, 3, 7, 2)]
    config = {"models": [{**fake(), "max_batch_tokens": 12}]}
    async with Registry.from_config(config) as registry:
        results = await registry.embed("fake", texts)
        assert len(adapter_of(registry, "fake").batches) > 1
    for text, vector in zip(texts, vectors(results), strict=True):
        np.testing.assert_array_equal(vector, fake_vector(text, 8))
    assert results.tokens == sum(len(t.split()) for t in texts)


async def test_a_failing_batch_fails_exactly_its_requests_of_the_same_priority_and_no_other() -> None:
    # Two items per batch: the poison shares its batch with one healthy request of its class.
    config = {"models": [{**fake(fail_on="boom", delay=0.3), "max_batch_tokens": 2}]}
    async with Registry.from_config(config) as registry:
        adapter = traffic_only(registry, "fake")
        # One batch runs and one waits prefetched, so the next three queue up together, in order.
        running = asyncio.create_task(registry.embed("fake", ["running"]))
        await forward_started(adapter)
        prefetched = asyncio.create_task(registry.embed("fake", ["prefetched"]))
        await until(lambda: collated_ahead(registry, "fake"))
        poison = asyncio.create_task(registry.embed("fake", ["boom"]))
        await until(lambda: registry.info("fake").queue_depth, lambda depth: depth == 1)
        neighbour = asyncio.create_task(registry.embed("fake", ["neighbour"]))
        await until(lambda: registry.info("fake").queue_depth, lambda depth: depth == 2)
        later = asyncio.create_task(registry.embed("fake", ["later"]))
        outcomes = await asyncio.gather(running, prefetched, poison, neighbour, later, return_exceptions=True)
        failed = [isinstance(o, BatchFailed) for o in outcomes]
        assert failed == [False, False, True, True, False], outcomes
        assert "injected failure" in str(outcomes[2])
        assert adapter_of(registry, "fake").batches == [1, 1, 2, 1]
        assert len(vectors(await registry.embed("fake", ["still serving"]))) == 1


async def test_the_collator_sleeps_through_an_idle_forward_and_prefetches_work_that_arrives() -> None:
    async with Registry.from_config({"models": [fake(delay=0.3)]}) as registry:
        adapter = traffic_only(registry, "fake")
        collating = collating_threads(adapter)
        worker = registry._handles["fake"].worker
        assert worker is not None
        first = asyncio.create_task(registry.embed("fake", ["alone"]))
        await forward_started(adapter)  # its forward pass runs, with nothing else queued
        assert adapter.batches == [1]
        assert not worker._running.is_set()
        second = asyncio.create_task(registry.embed("fake", ["arrives"]))
        await until(worker._running.is_set)  # queued while the first one runs: prefetch it
        assert worker._running.is_set()
        await asyncio.gather(first, second)
        assert collating == ["fake-forward", "fake-collate"]
        assert adapter.batches == [1, 1]


async def test_an_idle_forward_thread_pauses_after_delivering_until_work_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With nothing queued, the forward thread delivers, then pauses before its bookkeeping so that
    # the event loop answers first. A pause far longer than the test must not hold anything up:
    # work arriving ends it (and is taken by the forward thread itself, not the collator), and so
    # does unloading the model.
    monkeypatch.setattr(worker_module, "_YIELD", 60.0)
    registry = Registry.from_config({"models": [fake()]})
    await registry.start()
    try:
        adapter = traffic_only(registry, "fake")
        collating = collating_threads(adapter)
        worker = registry._handles["fake"].worker
        assert worker is not None
        started = time.monotonic()
        first = vectors(await registry.embed("fake", ["first"]))  # delivered before the pause
        await until(lambda: worker._pausing)
        assert worker._pausing
        assert worker.busy  # its bookkeeping waits
        second = vectors(await registry.embed("fake", ["second"]))
        np.testing.assert_array_equal(first[0], fake_vector("first", 8))
        np.testing.assert_array_equal(second[0], fake_vector("second", 8))
        assert collating == ["fake-forward", "fake-forward"]
        assert adapter.batches == [1, 1]
    finally:
        await registry.stop()
    assert time.monotonic() - started < 10  # neither the second request nor the unload waited out a pause


async def test_cancelled_requests_never_reach_the_model() -> None:
    async with Registry.from_config({"models": [fake(delay=0.3)]}) as registry:
        adapter = traffic_only(registry, "fake")
        blocker = asyncio.create_task(registry.embed("fake", ["first"]))
        await forward_started(adapter)
        victim = asyncio.create_task(registry.embed("fake", ["never computed"] * 20))
        # Queued behind it, or already taken by the collator to run next.
        await until(lambda: registry.info("fake").queue_depth == 20 or collated_ahead(registry, "fake"))
        victim.cancel()
        await blocker
        await asyncio.sleep(0.4)  # long enough for the worker to have run it, were it not dropped
        assert adapter_of(registry, "fake").batches == [1]
        await until(lambda: registry.info("fake").queue_depth, lambda depth: depth == 0)  # dropped at the next batch
        assert registry.info("fake").queue_depth == 0


async def test_deadline_exceeded_when_the_model_is_too_slow() -> None:
    async with Registry.from_config({"models": [fake(delay=0.5)]}) as registry:
        with pytest.raises(DeadlineExceeded):
            await registry.embed("fake", ["slow"], timeout=0.1)


async def test_a_full_queue_is_overloaded_not_a_hang() -> None:
    config = {"models": [{**fake(delay=0.3), "max_queued_items": 4}], "max_inputs_per_request": 4}
    async with Registry.from_config(config) as registry:
        adapter = traffic_only(registry, "fake")
        running = asyncio.create_task(registry.embed("fake", ["a"]))
        await forward_started(adapter)
        # One batch runs, one is prefetched, the next fills the queue's 4 places.
        prefetched = asyncio.create_task(registry.embed("fake", ["b"] * 4))
        await until(lambda: collated_ahead(registry, "fake"))
        waiting = asyncio.create_task(registry.embed("fake", ["c"] * 4))
        await until(lambda: registry.info("fake").queue_depth, lambda depth: depth == 4)
        with pytest.raises(Overloaded) as raised:
            await registry.embed("fake", ["d"])
        assert raised.value.retry_after >= 1
        await asyncio.gather(running, prefetched, waiting)


async def test_input_validation_names_the_problem() -> None:
    config = {"models": [fake()], "max_inputs_per_request": 3, "max_input_chars": 10}
    async with Registry.from_config(config) as registry:
        with pytest.raises(InvalidInput, match="must not be empty"):
            await registry.embed("fake", [])
        with pytest.raises(InvalidInput, match="input 1 is empty"):
            await registry.embed("fake", ["ok", ""])
        with pytest.raises(InvalidInput, match="at most 3"):
            await registry.embed("fake", ["a"] * 4)
        with pytest.raises(InvalidInput, match="input 0 has 11 characters"):
            await registry.embed("fake", ["x" * 11])
        with pytest.raises(UnknownModel, match="Models served: fake"):
            await registry.embed("nope", ["a"])


async def test_a_broken_pinned_model_makes_the_registry_unready_but_others_serve(tmp_path: Any) -> None:
    config = {"models": [fake(), {"name": "broken", "source": str(tmp_path), "pin": True}]}
    async with Registry.from_config(config) as registry:
        assert not registry.ready
        assert registry.info("broken").state.value == "failed"
        with pytest.raises(ModelUnavailable, match=r"no config\.json"):
            await registry.embed("broken", ["a"])
        assert len(vectors(await registry.embed("fake", ["a"]))) == 1


def test_sync_wrapper_for_scripts() -> None:
    with SyncRegistry.from_config({"models": [fake()]}) as registry:
        results = registry.embed("fake", ["hello world"])
        assert registry.infos()[0].state.value == "loaded"
    np.testing.assert_array_equal(vectors(results)[0], fake_vector("hello world", 8))


def test_the_sync_wrapper_leaves_no_loop_behind_when_its_start_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """`__exit__` does not run when `__enter__` raises: the loop and its thread end there."""
    wrapper = SyncRegistry.from_config({"models": [fake()]})

    async def broken(wait: bool = True) -> None:
        raise RuntimeError("start failed")

    monkeypatch.setattr(wrapper.registry, "start", broken)
    threads = {t.name for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="start failed"), wrapper:
        pass
    assert "registry-loop" not in {t.name for t in threading.enumerate()} - threads
    assert wrapper._loop is None
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        wrapper.embed("fake", ["a"])


class _ThreadRecorder:
    """An adapter's `prepare` that notes the thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def prepare(self, items: Any) -> list[Any]:
        self.threads.append(threading.current_thread().name)
        return list(items)


async def test_small_text_requests_are_tokenized_on_the_loop_and_others_on_the_model_threads() -> None:
    recorder = _ThreadRecorder()
    stage = PrepareStage("m", cast(Adapter, recorder), threads=1)
    text, image = EmbedItem(Text("a query")), EmbedItem(Media(Modality.IMAGE, b"\x89PNG"))
    try:
        await stage.run([text], 5.0, reads=INLINE_COST)
        await stage.run([text], 5.0, reads=INLINE_COST + 1)
        await stage.run([image], 5.0, reads=1)
        await stage.run([text], 5.0)
    finally:
        stage.stop()
    loop_thread = threading.current_thread().name
    assert recorder.threads[0] == loop_thread
    assert all(name.startswith("m-prepare") for name in recorder.threads[1:])
