"""Batch budgets: a fixed one says where it comes from; `max_batch_tokens: auto` keeps the smallest
budget within 5% of the best throughput among batches that stay within `max_batch_seconds`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_registry import Registry
from model_registry.adapters.fake import FakeAdapter
from model_registry.config import ModelSpec
from model_registry.runtime import warmup
from model_registry.runtime.assembly import batch_tokens, budget_candidates
from model_registry.runtime.lifecycle import timed_warm_up
from model_registry.types import Prepared
from tests.builders.text import tiny_bert

CPU_CANDIDATES = (512, 1024, 2048, 4096)


def timed_by(seconds: Callable[[int], float]) -> Callable[[Any, list[Prepared]], float]:
    """A stand-in for the batch timer: the seconds a batch of this cost would take."""
    return lambda adapter, prepared: seconds(sum(p.cost for p in prepared))


def test_the_candidates_surround_the_cpu_default_and_stay_within_the_gpu_default() -> None:
    assert budget_candidates("cpu") == CPU_CANDIDATES
    assert budget_candidates("cuda:0") == (2048, 4096, 8192, 16384)


def test_the_largest_batch_a_load_prepares_for_is_the_largest_it_may_run() -> None:
    def spec(**keys: Any) -> ModelSpec:
        return ModelSpec.model_validate({"name": "m", "source": "/models/m", **keys})

    assert batch_tokens(spec(), "cpu") == 1024
    assert batch_tokens(spec(), "cuda:0") == 16384  # a model with `device: auto` on a GPU
    assert batch_tokens(spec(max_batch_tokens=300), "cuda:0") == 300
    assert batch_tokens(spec(max_batch_tokens="auto"), "cpu") == 4096
    assert batch_tokens(spec(max_batch_tokens="auto", kind="fake"), "cpu") == 1024  # fakes are not timed


def test_throughput_that_keeps_rising_takes_the_largest_budget_within_the_time_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 ms of overhead per batch plus 10 us per token: each doubling gains well over 5%.
    monkeypatch.setattr(warmup, "_timed", timed_by(lambda cost: 0.02 + cost * 1e-5))
    budget = warmup.measure_budget(FakeAdapter({"max_length": 256}), CPU_CANDIDATES, max_seconds=0.05)
    assert budget is not None
    # 4,096 tokens take 0.061 s, over the bound: timed (and shown) but not kept.
    assert (budget.tokens, budget.chosen_by) == (2048, "measured")
    assert [tokens for tokens, _ in budget.trials] == list(CPU_CANDIDATES)
    assert budget.rate is not None
    assert budget.rate.cost == 2048


def test_a_flat_throughput_keeps_the_smallest_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # Throughput within 5% at every size: the smallest budget, so small requests wait least.
    gains = {512: 1.0, 1024: 1.04, 2048: 1.02, 4096: 1.045}
    monkeypatch.setattr(warmup, "_timed", timed_by(lambda cost: cost / (10_000 * gains[cost])))
    budget = warmup.measure_budget(FakeAdapter({"max_length": 256}), CPU_CANDIDATES, max_seconds=1.0)
    assert budget is not None
    assert budget.tokens == 512


def test_a_peak_in_the_middle_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    gains = {512: 1.0, 1024: 1.3, 2048: 1.6, 4096: 1.2}  # the largest batch spills out of the cache
    monkeypatch.setattr(warmup, "_timed", timed_by(lambda cost: cost / (10_000 * gains[cost])))
    budget = warmup.measure_budget(FakeAdapter({"max_length": 256}), CPU_CANDIDATES, max_seconds=1.0)
    assert budget is not None
    assert budget.tokens == 2048


def test_when_even_the_smallest_batch_is_too_slow_the_smallest_budget_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warmup, "_timed", timed_by(lambda cost: 1.0))
    budget = warmup.measure_budget(FakeAdapter({"max_length": 256}), CPU_CANDIDATES, max_seconds=0.5)
    assert budget is not None
    assert budget.tokens == 512
    assert [tokens for tokens, _ in budget.trials] == [512]  # nothing larger was tried


async def test_a_loaded_model_shows_its_budget_and_how_it_was_chosen(tmp_path: Path) -> None:
    bert = tiny_bert(tmp_path / "bert")
    config = {
        "models": [
            {"name": "measured", "source": str(bert), "backend": "torch", "max_batch_tokens": "auto"},
            {"name": "configured", "source": str(bert), "backend": "torch", "max_batch_tokens": 300},
            {"name": "default", "source": str(bert), "backend": "torch"},
        ]
    }
    async with Registry.from_config(config) as registry:
        for name in ("measured", "configured", "default"):
            await registry.load(name)
        measured = registry.info("measured").extra["batch_budget"]
        assert measured["chosen_by"] == "measured"
        assert measured["tokens"] in CPU_CANDIDATES
        assert measured["trials"][0]["tokens"] == 512
        assert all(t["batch_seconds"] > 0 and t["tokens_per_second"] > 0 for t in measured["trials"])
        assert registry.info("configured").extra["batch_budget"] == {"tokens": 300, "chosen_by": "configured"}
        assert registry.info("default").extra["batch_budget"] == {"tokens": 1024, "chosen_by": "device default"}
        # The queue packs against the budget shown.
        for name in ("measured", "configured", "default"):
            queue = registry._handles[name].queue
            assert queue is not None
            assert queue.max_batch_tokens == registry.info(name).extra["batch_budget"]["tokens"]


class Recording(FakeAdapter):
    """A fake whose forward passes note their model, start, end and thread."""

    def __init__(self, name: str, spans: list[tuple[str, float, float, str]], backend: str = "fake") -> None:
        super().__init__({"max_length": 64, "delay": 0.05})
        self.name, self.spans, self.backend, self.device = name, spans, backend, "cpu"

    def forward(self, batch: list[str]) -> list[Any]:
        began = time.monotonic()
        output = super().forward(batch)
        self.spans.append((self.name, began, time.monotonic(), threading.current_thread().name))
        return output


def test_two_models_are_never_timed_at_once_on_a_device() -> None:
    """Pinned models load together: timed side by side, each would measure the other's batches too."""
    spans: list[tuple[str, float, float, str]] = []
    specs = [
        ModelSpec.model_validate({"name": n, "source": "fake", "kind": "fake", "max_batch_tokens": 64}) for n in "ab"
    ]
    threads = [
        threading.Thread(target=timed_warm_up, args=(Recording(spec.name, spans), spec, "cpu", 1.0)) for spec in specs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {name for name, *_ in spans} == {"a", "b"}
    for name, began, ended, _ in spans:
        others = [(b, e) for n, b, e, _ in spans if n != name]
        assert all(ended <= b or e <= began for b, e in others), f"{name}'s timed batch overlapped another model's"


def test_a_cpu_torch_model_is_timed_on_the_thread_it_serves_on() -> None:
    """The shared torch thread, with the OpenMP pool its batches use when it serves; other
    engines' batches run on the timing thread itself."""
    spans: list[tuple[str, float, float, str]] = []
    for backend in ("torch", "onnx"):
        rate = warmup.measure_rate(Recording(backend, spans, backend=backend), 64)
        assert rate is not None
        assert rate.seconds >= 0.05
    threads = {name: thread for name, _, _, thread in spans}
    assert threads == {"torch": "cpu-torch", "onnx": threading.current_thread().name}
