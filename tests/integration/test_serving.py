"""The serving machinery over HTTP with the fake model: failures, overload, disconnects, probes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from model_registry.adapters.fake import FakeAdapter, fake_vector
from tests.conftest import REPO, LiveServer, free_port
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def fake(name: str = "fake", **options: Any) -> dict[str, Any]:
    return {"name": name, "source": "fake", "kind": "fake", "pin": True, "options": options}


def fake_adapter(server: LiveServer, name: str) -> FakeAdapter:
    adapter = server.app.state.registry._handles[name].adapter
    assert isinstance(adapter, FakeAdapter)
    return adapter


def traffic_only(server: LiveServer, name: str) -> FakeAdapter:
    """The model's adapter with the batches its load timed (for admission) forgotten."""
    adapter = fake_adapter(server, name)
    adapter.batches.clear()
    return adapter


def queued(server: LiveServer, name: str) -> int:
    """Items waiting in the model's queue (a batch taken from it, prefetched or running, is not)."""
    depth: int = server.app.state.registry.info(name).queue_depth
    return depth


def collated_ahead(server: LiveServer, name: str) -> bool:
    """Whether the model's collator holds a batch, collated, for the forward pass after this one."""
    worker = server.app.state.registry._handles[name].worker
    return worker is not None and worker._handoff.full()


def post(server: LiveServer, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    with server.client(**kwargs) as client:
        return client.post("/v1/embeddings", json=body)


def test_an_injected_failure_fails_exactly_the_batch_it_shares_with_healthy_requests(serve: Any) -> None:
    # Two items per batch, every request of the same (default) priority: the poison shares its
    # batch with one healthy request; the request after them runs in the next batch.
    server = serve({"models": [{**fake(fail_on="boom", delay=1.0), "max_batch_tokens": 2}]})
    adapter = traffic_only(server, "fake")
    texts = ["running", "prefetched", "boom", "neighbour", "later"]
    # One batch runs and one waits prefetched before the last three queue, the poison first.
    reached = [
        lambda: bool(adapter.batches),
        lambda: collated_ahead(server, "fake"),
        lambda: queued(server, "fake") == 1,
        lambda: True,
        lambda: True,
    ]
    with ThreadPoolExecutor(len(texts)) as pool:
        futures = []
        for text, state in zip(texts, reached, strict=True):
            futures.append(pool.submit(post, server, {"model": "fake", "input": [text]}))
            eventually(state)
        responses = [f.result() for f in futures]
    statuses = [r.status_code for r in responses]
    # Under load the last two may reach the queue in either order: the first of them shares the
    # poison's batch and fails with it, the other runs in a batch of its own and succeeds.
    assert statuses[:3] == [200, 200, 500], [r.text for r in responses]
    assert sorted(statuses[3:]) == [200, 500], [r.text for r in responses]
    assert fake_adapter(server, "fake").batches == [1, 1, 2, 1]
    for failed in (r for r in responses if r.status_code == 500):
        assert failed.json()["error"]["code"] == "model_error"
        assert "injected failure" in failed.json()["error"]["message"]
    ok = next(i for i in (3, 4) if statuses[i] == 200)
    np.testing.assert_allclose(responses[ok].json()["data"][0]["embedding"], fake_vector(texts[ok], 8), atol=1e-6)
    assert post(server, {"model": "fake", "input": ["after"]}).status_code == 200


def test_a_full_queue_answers_429_with_retry_after(serve: Any) -> None:
    server = serve(
        {"models": [{**fake(delay=0.5), "max_queued_items": 8, "max_batch_tokens": 8}], "max_inputs_per_request": 8}
    )
    bodies = [{"model": "fake", "input": [f"item {i}"] * 8} for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda b: post(server, b), bodies))
    statuses = sorted(r.status_code for r in responses)
    assert 429 in statuses
    assert 200 in statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert post(server, {"model": "fake", "input": ["after"]}).status_code == 200


def test_a_disconnected_client_costs_no_compute(serve: Any) -> None:
    server = serve({"models": [fake(delay=0.6)]})
    adapter = traffic_only(server, "fake")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, server, {"model": "fake", "input": ["first"]})
        eventually(lambda: adapter.batches)  # its forward pass runs
        with pytest.raises(httpx.ReadTimeout):
            post(server, {"model": "fake", "input": ["abandoned"] * 30}, timeout=0.2)
        assert first.result().status_code == 200
    time.sleep(0.8)
    assert fake_adapter(server, "fake").batches == [1]


def test_request_deadline_is_504(serve: Any) -> None:
    server = serve({"models": [fake(delay=1.0)], "request_timeout": 0.3})
    response = post(server, {"model": "fake", "input": ["slow"]})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"


def test_ready_is_false_while_a_pinned_model_is_broken(serve: Any, tmp_path: Any) -> None:
    server = serve({"models": [fake(), {"name": "broken", "source": str(tmp_path), "pin": True}]})
    with server.client() as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["pinned"] == {"fake": "loaded", "broken": "failed"}
        unavailable = client.post("/v1/embeddings", json={"model": "broken", "input": ["a"]})
        assert unavailable.status_code == 503
        assert "no config.json" in unavailable.json()["error"]["message"]
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["broken"]["status"] == "failed"
        assert models["fake"]["status"] == "loaded"
        assert client.post("/v1/embeddings", json={"model": "fake", "input": ["a"]}).status_code == 200


def test_api_key_is_required_when_configured(serve: Any) -> None:
    server = serve({"models": [fake()]}, api_key="secret")
    body = {"model": "fake", "input": ["a"]}
    with server.client() as client:
        assert client.post("/v1/embeddings", json=body).status_code == 401
        wrong = client.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.json()["error"]["type"] == "authentication_error"
        ok = client.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200
        assert client.get("/health").status_code == 200


def test_metrics_are_prometheus_exposition(serve: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    server = serve({"models": [fake()]})
    post(server, {"model": "fake", "input": ["a", "b"]})
    with server.client() as client:
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    items = {s.labels["model"]: s.value for s in families["infinity_batch_items"].samples if s.name.endswith("_total")}
    assert items == {"fake": 2.0}
    requests = [s for s in families["infinity_requests"].samples if s.labels.get("route") == "/v1/embeddings"]
    assert any(s.labels["status"] == "200" and s.value >= 1 for s in requests)


def test_the_readme_serve_command_serves_the_bundled_model() -> None:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [str(REPO / "scripts" / "serve"), "--port", str(port), "--host", "127.0.0.1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        created = client.embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
        assert len(created.data) == 2
        assert len(created.data[0].embedding) == 384
        curl_like = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hello"}
        )
        assert curl_like.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(30) == 0
        finally:
            process.kill()
            if process.stdout:
                process.stdout.close()
