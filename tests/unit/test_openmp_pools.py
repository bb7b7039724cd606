"""One OpenMP pool per forward thread: loads run on threads that end with them, and the prepare and
collate threads run torch's operators on one thread.

Every thread that runs a parallel torch operator keeps a pool of its own for as long as it lives;
with more pool threads than cores, libgomp stops them spinning between operators and every
forward pass slows down (`lifecycle.on_own_thread`, `worker.side_thread`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

from model_registry import Registry
from model_registry import worker as worker_module
from model_registry.adapters.fake import FakeAdapter
from model_registry.lifecycle import on_own_thread
from model_registry.types import EmbedItem, Text
from model_registry.worker import PrepareStage, side_thread
from tests.unit.test_registry import adapter_of, collating_threads, fake


def torch_threads_on_a_new_thread(setup: Any = None) -> int:
    seen: list[int] = []

    def run() -> None:
        if setup is not None:
            setup()
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


async def test_work_runs_on_a_thread_of_its_own_that_ends_with_it() -> None:
    ran_on: list[threading.Thread] = []

    def work(value: int) -> int:
        ran_on.append(threading.current_thread())
        return value * 2

    assert await on_own_thread(work, 21) == 42
    assert await on_own_thread(work, 1) == 2
    first, second = ran_on
    assert first is not threading.current_thread()
    assert second is not first
    for thread in ran_on:
        thread.join(5)
        assert not thread.is_alive()


async def test_an_error_reaches_the_caller() -> None:
    def work() -> None:
        raise ValueError("broken weights")

    with pytest.raises(ValueError, match="broken weights"):
        await on_own_thread(work)


def test_work_that_outlives_its_loop_is_dropped_quietly() -> None:
    release = threading.Event()
    finished = threading.Event()

    def work() -> int:
        release.wait(5)
        finished.set()
        return 1

    async def start() -> None:
        on_own_thread(work)

    asyncio.run(start())  # the loop closes while the work still runs
    release.set()
    assert finished.wait(5)


async def test_a_models_load_runs_on_a_thread_that_has_ended_once_it_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded_on: list[threading.Thread] = []
    original = FakeAdapter.load

    def load(self: FakeAdapter, options: Any) -> None:
        loaded_on.append(threading.current_thread())
        original(self, options)

    monkeypatch.setattr(FakeAdapter, "load", load)
    async with Registry.from_config({"models": [fake()]}) as registry:
        assert adapter_of(registry, "fake").loaded
        (thread,) = loaded_on
        thread.join(5)
        assert not thread.is_alive()  # an executor's thread would stay, and its pool with it
        await registry.embed("fake", ["after the load"])


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread is already the most a thread takes")
def test_side_threads_run_torch_on_one_thread_and_others_keep_the_pool() -> None:
    assert torch_threads_on_a_new_thread() == torch.get_num_threads()
    assert torch_threads_on_a_new_thread(side_thread) == 1


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread is already the most a thread takes")
async def test_prepare_threads_run_torch_on_one_thread() -> None:
    adapter = FakeAdapter({})
    counts: list[int] = []
    original = adapter.prepare

    def prepare(items: Any) -> Any:
        counts.append(torch.get_num_threads())
        return original(items)

    adapter.prepare = prepare  # type: ignore[method-assign]
    stage = PrepareStage("m", adapter, threads=2)
    try:
        await stage.run([EmbedItem(Text("a text"))], 5.0)  # `reads` unset: always on the model's threads
    finally:
        stage.stop()
    assert counts == [1]


async def test_the_collate_thread_is_set_up_as_a_side_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    set_up: list[str] = []
    monkeypatch.setattr(worker_module, "side_thread", lambda: set_up.append(threading.current_thread().name))
    async with Registry.from_config({"models": [fake(delay=0.3)]}) as registry:
        adapter = adapter_of(registry, "fake")
        collating = collating_threads(adapter)
        first = asyncio.create_task(registry.embed("fake", ["alone"]))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(registry.embed("fake", ["arrives"]))  # prefetched by the collator
        await asyncio.gather(first, second)
    assert "fake-collate" in collating
    assert "fake-collate" in set_up
    assert "fake-forward" not in set_up
