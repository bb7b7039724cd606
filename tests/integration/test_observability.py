"""Request ids, timing headers, JSON logs, stage metrics and spans, over real HTTP with the fake model."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from infinity_server.app import create_app
from infinity_server.logs import JsonFormatter
from infinity_server.settings import ServerSettings, Settings
from model_registry.adapters.fake import FakeAdapter
from model_registry.config import registry_config
from tests.conftest import LiveServer, start_server
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DELAY = 0.25  # each batch's forward pass, in seconds


def fake(**options: Any) -> dict[str, Any]:
    return {"name": "fake", "source": "fake", "kind": "fake", "pin": True, "options": {"delay": DELAY, **options}}


def embed(client: httpx.Client, texts: list[str], **headers: str) -> httpx.Response:
    return client.post("/v1/embeddings", json={"model": "fake", "input": texts}, headers=headers)


def test_request_ids_are_echoed_or_generated(serve: Any) -> None:
    server = serve({"models": [fake(delay=0)]}, api_key="k")
    auth = {"Authorization": "Bearer k"}
    with server.client(headers=auth) as client:
        assert embed(client, ["a"], **{"X-Request-Id": "trace-42.a:b"}).headers["x-request-id"] == "trace-42.a:b"
        generated = {embed(client, ["a"]).headers["x-request-id"] for _ in range(2)}
        assert len(generated) == 2
        assert all(len(g) == 32 and int(g, 16) >= 0 for g in generated)
        for bad in ("has spaces", "x" * 129, 'quote"s'):
            assert embed(client, ["a"], **{"X-Request-Id": bad}).headers["x-request-id"] != bad
    with server.client() as anonymous:  # errors from the outer middleware carry it too
        refused = embed(anonymous, ["a"], **{"X-Request-Id": "refused-1"})
        assert refused.status_code == 401
        assert refused.headers["x-request-id"] == "refused-1"


def forward_passes(server: LiveServer) -> list[int]:
    """The fake model's forward passes so far (each is recorded as it starts), its load's included."""
    adapter = server.app.state.registry._handles["fake"].adapter
    assert isinstance(adapter, FakeAdapter)
    return adapter.batches


def test_timing_headers_measure_queue_and_inference(serve: Any) -> None:
    server = serve({"models": [{**fake(), "max_batch_tokens": 1}]})
    ran = len(forward_passes(server))
    with server.client() as client, ThreadPoolExecutor(2) as pool:
        first = pool.submit(embed, client, ["first"])
        eventually(lambda: len(forward_passes(server)), lambda passes: passes > ran)  # the first is in its forward pass
        second = pool.submit(embed, client, ["second"])
        responses = [first.result(30), second.result(30)]
    for response in responses:
        assert response.status_code == 200
        headers = {name: float(response.headers[name]) for name in ("x-total-time", "x-queue-time")}
        inference, tokenization = float(response.headers["x-inference-time"]), response.headers["x-tokenization-time"]
        assert inference >= DELAY * 1000
        assert float(tokenization) >= 0
        assert headers["x-total-time"] >= inference + headers["x-queue-time"]
    # The second waited in the queue while the first's forward pass ran (one item per batch).
    assert float(responses[1].headers["x-queue-time"]) >= DELAY * 1000 / 2


def access_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    records = [r for r in caplog.records if r.name == "infinity_server.access"]
    lines = [json.loads(JsonFormatter().format(r)) for r in records]
    return next((entry for entry in lines if entry.get("request_id") == request_id), {})


def test_access_log_lines_are_json_with_the_request_id(serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = serve({"models": [fake(delay=0)]})
    with caplog.at_level(logging.INFO, logger="infinity_server.access"), server.client() as client:
        embed(client, ["a b"], **{"X-Request-Id": "logged-1"})
        line = eventually(lambda: access_line(caplog, "logged-1"))  # written just after the response is sent
    assert line["route"] == "/v1/embeddings"
    assert line["status"] == 200
    assert line["models"] == ["fake"]
    assert line["level"] == "info"
    assert set(line["timings_ms"]) == {"total", "tokenization", "queue", "inference"}


def test_stage_and_batch_metrics_per_model(serve: Any) -> None:
    server = serve({"models": [{**fake(delay=0), "max_batch_tokens": 12}]})
    with server.client() as client:
        # One request, one batch of two items: cost 2 x 3 words = 6 of 12, of which 2 are padding.
        assert embed(client, ["a", "a b c"]).status_code == 200
        text = client.get("/metrics").text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in samples if s.name == name and s.labels == labels)

    for stage in ("prepare", "queue", "forward", "postprocess"):
        assert value("infinity_stage_seconds_count", model="fake", stage=stage) == 1
    assert value("infinity_batch_fill_bucket", model="fake", le="0.4") == 0
    assert value("infinity_batch_fill_bucket", model="fake", le="0.5") == 1
    assert value("infinity_batch_padding_ratio_sum", model="fake") == pytest.approx(2 / 6)
    assert value("infinity_queue_tokens", model="fake") == 0
    assert value("infinity_queue_depth", model="fake") == 0
    # Loading the pinned model at start ran a generation-2 collection of what was not yet frozen
    # (model_registry.runtime.heap.freeze).
    assert value("infinity_gc_pause_seconds_count", generation="2") >= 1


@pytest.fixture
def traced() -> Iterator[tuple[LiveServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(ServerSettings(), registry_config({"models": [fake()]}))
    server = start_server(create_app(settings, tracer_provider=provider))
    yield server, exporter
    server.close()
    provider.shutdown()


def test_traceparent_is_continued_and_stages_are_spans(traced: tuple[LiveServer, InMemorySpanExporter]) -> None:
    server, exporter = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with server.client() as client:
        response = embed(client, ["a b"], traceparent=f"00-{trace_id}-{parent_id}-01")
    assert response.status_code == 200
    assert response.headers["traceparent"].startswith(f"00-{trace_id}-")
    exported = finished_spans(exporter, "POST /v1/embeddings")
    spans = {s.name: s for s in exported if s.context and f"{s.context.trace_id:032x}" == trace_id}
    root = spans["POST /v1/embeddings"]
    assert root.parent is not None
    assert root.context is not None
    assert f"{root.parent.span_id:016x}" == parent_id
    assert response.headers["traceparent"] == f"00-{trace_id}-{root.context.span_id:016x}-01"
    assert (root.attributes or {})["http.response.status_code"] == 200
    stages = [spans[name] for name in ("prepare", "queue", "forward", "postprocess")]
    for span in stages:
        assert span.parent is not None
        assert span.parent.span_id == root.context.span_id
        assert (span.attributes or {})["infinity.model"] == "fake"
    assert seconds(stages[2]) >= DELAY
    starts = [s.start_time or 0 for s in stages]
    assert starts == sorted(starts)
    assert (root.start_time or 0) <= starts[0]
    assert (stages[3].end_time or 0) <= (root.end_time or 0)


def finished_spans(exporter: InMemorySpanExporter, name: str) -> tuple[ReadableSpan, ...]:
    """The exported spans, once one named `name` is among them (spans end after the response)."""
    return eventually(exporter.get_finished_spans, lambda spans: any(s.name == name for s in spans))


def seconds(span: ReadableSpan) -> float:
    return ((span.end_time or 0) - (span.start_time or 0)) / 1e9


def test_without_traceparent_a_new_trace_starts(traced: tuple[LiveServer, InMemorySpanExporter]) -> None:
    server, exporter = traced
    with server.client() as client:
        response = embed(client, ["a"])
    _, trace_id, span_id, _ = response.headers["traceparent"].split("-")
    root = next(s for s in finished_spans(exporter, "POST /v1/embeddings") if s.name == "POST /v1/embeddings")
    assert root.parent is None
    assert root.context is not None
    assert (f"{root.context.trace_id:032x}", f"{root.context.span_id:016x}") == (trace_id, span_id)


def test_tracing_on_without_an_sdk_provider_serves_as_usual(serve: Any) -> None:
    server = serve({"models": [fake(delay=0)]}, tracing=True)  # spans go to the global no-op provider
    with server.client() as client:
        response = embed(client, ["a"])
    assert response.status_code == 200
    assert "traceparent" not in response.headers
    assert "x-inference-time" in response.headers


def test_latency_per_model_and_device_memory_are_exported(serve: Any) -> None:
    server = serve({"models": [fake(delay=0, footprint=4096)]}, admin_routes=True)
    with server.client() as client:
        for texts in (["a"], ["b", "c"]):
            assert embed(client, texts).status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        memory = client.get("/v1/memory").json()["devices"]
    counts = {
        (s.labels["model"], s.labels["route"]): s.value
        for s in families["infinity_model_request_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts[("fake", "/v1/embeddings")] == 2
    budgets = {s.labels["device"]: s.value for s in families["infinity_device_memory_budget_bytes"].samples}
    charged = {s.labels["device"]: s.value for s in families["infinity_device_memory_charged_bytes"].samples}
    assert budgets == {d["device"]: d["budget_bytes"] for d in memory}
    assert charged == {d["device"]: d["charged_bytes"] for d in memory}
    assert charged["cpu"] >= 4096  # the fake model's declared footprint
