"""One OpenMP pool in the process: every torch model on the CPU computes on one thread, loads run
on threads that end with them, and the prepare and collate threads run torch on one thread.

Every thread that runs a parallel torch operator keeps a pool of its own for as long as it lives;
with more pool threads than cores, libgomp stops them spinning between operators and every
forward pass slows down (`devices.torch_thread`, `lifecycle.on_own_thread`, `worker.side_thread`)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from model_registry import Registry
from model_registry.adapters.fake import FakeAdapter
from model_registry.errors import BatchFailed
from model_registry.runtime import worker as worker_module
from model_registry.runtime.lifecycle import on_own_thread
from model_registry.runtime.worker import PrepareStage, side_thread
from model_registry.types import EmbedItem, Text
from tests.builders.text import tiny_bert
from tests.unit.test_registry import adapter_of, collating_threads, fake, forward_started, traffic_only, vectors


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


def test_side_threads_run_torch_on_one_thread_and_others_keep_the_pool() -> None:
    if torch_threads_on_a_new_thread() < 2:
        pytest.skip("one thread is already the most a new thread takes")
    assert torch_threads_on_a_new_thread(side_thread) == 1


async def test_prepare_threads_run_torch_on_one_thread() -> None:
    if torch_threads_on_a_new_thread() < 2:
        pytest.skip("one thread is already the most a new thread takes")
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
        adapter = traffic_only(registry, "fake")
        collating = collating_threads(adapter)
        first = asyncio.create_task(registry.embed("fake", ["alone"]))
        await forward_started(adapter)
        second = asyncio.create_task(registry.embed("fake", ["arrives"]))  # prefetched by the collator
        await asyncio.gather(first, second)
    assert "fake-collate" in collating
    assert "fake-collate" in set_up
    assert "fake-forward" not in set_up


async def test_every_torch_model_on_the_cpu_computes_on_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_registry.adapters.dense import DenseAdapter

    ran: list[tuple[str, str]] = []
    forward, postprocess = DenseAdapter.forward, DenseAdapter.postprocess

    def recording_forward(self: DenseAdapter, batch: Any) -> Any:
        ran.append(("forward", threading.current_thread().name))
        return forward(self, batch)

    def recording_postprocess(self: DenseAdapter, batch: Any, output: Any) -> Any:
        ran.append(("postprocess", threading.current_thread().name))
        return postprocess(self, batch, output)

    monkeypatch.setattr(DenseAdapter, "forward", recording_forward)
    monkeypatch.setattr(DenseAdapter, "postprocess", recording_postprocess)
    models = [
        {
            "name": name,
            "source": str(tiny_bert(tmp_path / name, seed=seed)),
            "backend": "torch",
            "device": "cpu",
            "pin": True,
        }
        for name, seed in (("first", 0), ("second", 1))
    ]
    async with Registry.from_config({"models": [*models, fake()]}) as registry:
        ran.clear()  # the loads' warm-up ran on their own threads
        first, second = await asyncio.gather(
            registry.embed("first", ["a cat sat on the mat"]), registry.embed("second", ["a dog ran"])
        )
        assert ran
        assert {thread for _, thread in ran} == {"cpu-torch"}
        assert {step for step, _ in ran} == {"forward", "postprocess"}
        assert len(vectors(first)) == 1
        assert len(vectors(second)) == 1


async def test_a_failing_batch_on_the_shared_thread_fails_only_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_registry.adapters.dense import DenseAdapter

    forward = DenseAdapter.forward

    def failing(self: DenseAdapter, batch: Any) -> Any:
        if getattr(self, "broken", False):
            raise RuntimeError(f"injected failure on {threading.current_thread().name}")
        return forward(self, batch)

    monkeypatch.setattr(DenseAdapter, "forward", failing)
    models = [
        {"name": name, "source": str(tiny_bert(tmp_path / name)), "backend": "torch", "device": "cpu", "pin": True}
        for name in ("broken", "healthy")
    ]
    async with Registry.from_config({"models": models}) as registry:
        registry._handles["broken"].adapter.broken = True  # type: ignore[union-attr]
        with pytest.raises(BatchFailed, match="injected failure on cpu-torch"):
            await registry.embed("broken", ["a text"])
        answered = await registry.embed("healthy", ["a text"])
        assert len(vectors(answered)) == 1


def test_the_openmp_runtime_is_found_where_torch_is_installed_behind_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/self/maps names real paths; a virtualenv reached through a symlink must still match."""
    from model_registry.backends.torch import engine as torch_backend

    if torch_backend._openmp() is None:
        pytest.skip("torch does not run on OpenMP here")
    linked = tmp_path / "site-packages"
    linked.symlink_to(Path(torch.__file__).resolve().parents[1], target_is_directory=True)
    monkeypatch.setattr(torch, "__file__", str(linked / "torch" / "__init__.py"))
    assert torch_backend._openmp.__wrapped__() is not None
