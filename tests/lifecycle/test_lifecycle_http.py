"""The lifecycle over real HTTP: eviction under traffic, one load for many callers, broken models."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders.lifecycle import budget_for, fake_model
from tests.builders.text import tiny_bert

pytestmark = pytest.mark.integration


def embed(client: httpx.Client, model: str, text: str = "some words") -> httpx.Response:
    return client.post("/v1/embeddings", json={"model": model, "input": [text]})


def entries(client: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in client.get("/models").json()["data"]}


def lifecycle_events(client: httpx.Client, kind: str) -> list[dict[str, Any]]:
    return [e for e in client.get("/v1/memory").json()["events"] if e["kind"] == kind]


def test_alternating_clients_over_three_models_with_room_for_two(serve: Any) -> None:
    models = [fake_model(n, delay=0.02) for n in "abc"]
    server = serve({"models": models, "memory_budget": budget_for(2), "room_wait": 30}, admin_routes=True)
    statuses: list[int] = []

    def client_loop(offset: int) -> None:
        with server.client() as client:
            for i in range(24):
                name = "abc"[(i + offset) % 3]
                statuses.append(embed(client, name, f"request {i} from {offset}").status_code)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert statuses == [200] * 72
    with server.client() as client:
        listed = entries(client)
        evictions = lifecycle_events(client, "evicted")
        memory = client.get("/v1/memory").json()["devices"]
    assert sorted(m["status"] for m in listed.values()) == ["loaded", "loaded", "unloaded"]
    for entry in listed.values():
        loaded = entry["status"] == "loaded"
        assert entry["footprint_bytes"] == (10 * 2**20 if loaded else None)
        assert entry["last_used"] is not None
        assert entry["queue_depth"] == 0
    assert evictions, "three models in room for two must evict"
    for event in evictions:
        oldest = min(event["candidates"], key=lambda c: c["lru_stamp"])
        assert event["model"] == oldest["model"]
    assert memory == [{"device": "cpu", "budget_bytes": budget_for(2), "charged_bytes": 20 * 2**20}]


def test_eviction_order_over_http_matches_an_order_fixed_in_advance(serve: Any) -> None:
    server = serve(
        {"models": [fake_model(n) for n in "abc"], "memory_budget": budget_for(2), "room_wait": 0}, admin_routes=True
    )
    # Room for two: each load of a third model evicts the one used longest ago.
    uses = "abacbab"
    expected = ["b", "a", "c"]  # c evicts b (a was used after it), b evicts a, a evicts c
    with server.client() as client:
        for name in uses:
            assert embed(client, name).status_code == 200
        assert [e["model"] for e in lifecycle_events(client, "evicted")] == expected
        assert sorted(m for m, entry in entries(client).items() if entry["status"] == "loaded") == ["a", "b"]


def test_fifty_concurrent_first_requests_cause_one_load(serve: Any) -> None:
    server = serve({"models": [fake_model("lazy", load_delay=0.5)]}, admin_routes=True)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            calls = [client.post("/v1/embeddings", json={"model": "lazy", "input": [f"t {i}"]}) for i in range(50)]
            return await asyncio.gather(*calls)

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 50
    with server.client() as client:
        assert len(lifecycle_events(client, "loaded")) == 1
        metrics = client.get("/metrics").text
    assert 'infinity_model_lifecycle_total{event="loaded",model="lazy"} 1.0' in metrics


def test_a_broken_model_answers_503_with_its_cause_and_loads_once_repaired(serve: Any, tmp_path: Path) -> None:
    broken = tiny_bert(tmp_path / "model")
    (broken / "model.safetensors").unlink()
    models = [fake_model("fine", pin=True), {"name": "broken", "source": str(broken), "backend": "torch", "pin": False}]
    server = serve({"models": models, "failed_retry_after": 0.5})
    with server.client() as client:
        assert client.get("/ready").status_code == 200  # a broken lazy model does not block readiness
        first = embed(client, "broken")
        assert first.status_code == 503
        error = first.json()["error"]
        assert error["code"] == "model_unavailable"
        assert "failed to load" in error["message"]
        assert "model.safetensors" in error["message"] or "no file named" in error["message"].lower()
        again = embed(client, "broken")
        assert again.status_code == 503
        assert "next attempt in" in again.json()["error"]["message"]
        assert embed(client, "fine").status_code == 200
        listed = entries(client)["broken"]
        assert listed["status"] == "failed"
        assert listed["error"]
        shutil.rmtree(broken)
        tiny_bert(broken)
        time.sleep(0.6)
        repaired = embed(client, "broken")
        assert repaired.status_code == 200, repaired.text
        assert entries(client)["broken"]["status"] == "loaded"
        assert entries(client)["broken"]["error"] is None


def test_a_broken_pinned_model_makes_ready_false_but_the_server_serves(serve: Any, tmp_path: Path) -> None:
    broken = tiny_bert(tmp_path / "model")
    (broken / "config.json").unlink()
    models = [fake_model("fine"), {"name": "broken", "source": str(broken), "backend": "torch", "pin": True}]
    server = serve({"models": models})
    with server.client() as client:
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["pinned"] == {"broken": "failed"}
        assert embed(client, "fine").status_code == 200
        assert "config.json" in entries(client)["broken"]["error"]


def test_load_and_unload_routes(serve: Any) -> None:
    models = [fake_model("p", pin=True), fake_model("a"), fake_model("b", mib=100), fake_model("org/c", mib=1)]
    server = serve({"models": models, "memory_budget": budget_for(2)}, admin_routes=True)
    with server.client() as client:
        loaded = client.post("/v1/models/a/load")
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["status"] == "loaded"
        assert loaded.json()["footprint_bytes"] == 10 * 2**20
        unloaded = client.post("/v1/models/a/unload")
        assert unloaded.status_code == 200
        assert unloaded.json()["status"] == "unloaded"
        assert unloaded.json()["footprint_bytes"] is None
        too_big = client.post("/v1/models/b/load")
        assert too_big.status_code == 503
        assert "needs 100.0 MiB" in too_big.json()["error"]["message"]
        missing = client.post("/v1/models/nope/load")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        newline = client.post("/v1/models/no%0Ape/unload")  # routed as a name, not "no route"
        assert newline.status_code == 404
        assert newline.json()["error"]["code"] == "model_not_found"
        slashed = client.post("/v1/models/org/c/load")
        assert slashed.status_code == 200
        assert slashed.json()["id"] == "org/c"
        pinned = client.post("/v1/models/p/unload")
        assert pinned.status_code == 400
        assert "pinned" in pinned.json()["error"]["message"]
        assert entries(client)["p"]["status"] == "loaded"
