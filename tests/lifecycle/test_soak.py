"""Soak: 10 models, a budget for 3, 2,000 mixed requests from 16 clients over real HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from benchmarks.soak import RssSampler, drive, soak_models

from model_registry import ModelState
from model_registry.handles import EventKind

pytestmark = pytest.mark.integration

MIB = 2**20
MODEL_MIB = 16
BUDGET = int(3.5 * MODEL_MIB * MIB)


def test_soak_stays_in_budget_evicts_in_lru_order_and_fails_only_by_design(serve: Any) -> None:
    models = soak_models(10, MODEL_MIB, delay=0.002, load_delay=0.0)
    server = serve({"models": models, "memory_budget": BUDGET, "room_wait": 0.5})
    registry = server.app.state.registry
    over_budget: list[int] = []
    done = threading.Event()

    def watch_charges() -> None:
        while not done.wait(0.005):
            charged = sum(u.charged for u in registry.memory())
            if charged > BUDGET:
                over_budget.append(charged)

    watcher = threading.Thread(target=watch_charges, daemon=True)
    with RssSampler() as rss:
        watcher.start()
        result = asyncio.run(drive(server.url, requests=2000, clients=16, models=10))
        done.set()
        watcher.join()

    assert sum(result.statuses.values()) == 2000
    assert set(result.statuses) <= {200, 429, 503}, result.statuses
    assert all(m.startswith("not enough memory on cpu") for m in result.errors), result.errors
    assert result.statuses[200] >= 1000, result.statuses
    assert over_budget == []
    # Ten models would hold 160 MiB; at most three and a half are allowed, plus the server's own.
    assert rss.growth <= BUDGET + 40 * MIB, f"RSS grew by {rss.growth / MIB:.1f} MiB"

    events = registry.events
    kinds = Counter(e.kind for e in events)
    assert kinds[EventKind.EVICTED] > 0
    for event in events:
        if event.kind == EventKind.EVICTED:
            assert event.model == min(event.candidates, key=lambda c: c[1])[0], event
    loaded_now = sum(1 for i in registry.infos() if i.state == ModelState.LOADED)
    assert kinds[EventKind.LOADED] - kinds[EventKind.EVICTED] - kinds[EventKind.UNLOADED] == loaded_now
    assert loaded_now <= 3
