"""Soak over real HTTP: traffic that fits the budget has no errors; traffic that thrashes it answers
only 200, 429 or 503, and the budget is never exceeded."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from model_registry import ModelState
from model_registry.runtime.handles import EventKind
from tests.builders.soak import RssSampler, SoakResult, drive, soak_models

# 2,000 requests over HTTP in all: seconds, not the milliseconds of a unit test.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

MIB = 2**20
MODEL_MIB = 16


@contextmanager
def charges_watched(registry: Any, budget: int) -> Iterator[list[int]]:
    """Every total charge seen above `budget`, sampled every 5 ms while the block runs."""
    over: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            charged = sum(u.charged for u in registry.memory())
            if charged > budget:
                over.append(charged)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield over
    finally:
        done.set()
        watcher.join()


def soak(serve: Any, models: int, budget: int, requests: int) -> tuple[SoakResult, Any, list[int], int]:
    server = serve({"models": soak_models(models, MODEL_MIB, delay=0.002, load_delay=0.0), "memory_budget": budget})
    registry = server.app.state.registry
    with RssSampler() as rss, charges_watched(registry, budget) as over:
        result = asyncio.run(drive(server.url, requests=requests, clients=16, models=models))
    return result, registry, over, rss.growth


def test_a_soak_that_fits_the_budget_has_no_errors(serve: Any) -> None:
    budget = int(4.5 * MODEL_MIB * MIB)
    result, registry, over, growth = soak(serve, models=4, budget=budget, requests=800)
    assert result.statuses == Counter({200: 800}), (result.statuses, result.errors)
    assert over == []
    assert [e for e in registry.events if e.kind == EventKind.EVICTED] == []
    assert growth <= budget + 40 * MIB, f"RSS grew by {growth / MIB:.1f} MiB"


def test_a_soak_that_thrashes_answers_only_200_429_503_and_never_exceeds_the_budget(serve: Any) -> None:
    budget = int(3.5 * MODEL_MIB * MIB)
    result, registry, over, growth = soak(serve, models=10, budget=budget, requests=1200)
    assert sum(result.statuses.values()) == 1200
    assert set(result.statuses) <= {200, 429, 503}, (result.statuses, result.errors)
    assert over == []
    # Ten models would hold 160 MiB; at most three and a half are allowed, plus the server's own.
    assert growth <= budget + 40 * MIB, f"RSS grew by {growth / MIB:.1f} MiB"
    kinds = Counter(e.kind for e in registry.events)
    assert kinds[EventKind.EVICTED] > 0
    loaded_now = sum(1 for i in registry.infos() if i.state == ModelState.LOADED)
    assert kinds[EventKind.LOADED] - kinds[EventKind.EVICTED] - kinds[EventKind.UNLOADED] == loaded_now
    assert loaded_now <= 3
