"""Prometheus metrics, one collector registry per app (no module globals)."""

from __future__ import annotations

import bisect
import contextlib
import gc
import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_registry import BatchStats, EventKind, LifecycleEvent, Registry, StageTimes
from model_registry import CacheLookup as Lookup
from model_registry import request_arrival as arrival

_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def stage_seconds(times: StageTimes) -> dict[str, float]:
    """The four engine stages of one run, in seconds."""
    return {
        "prepare": times.prepare_seconds,
        "queue": times.queue_seconds,
        "forward": times.forward_seconds,
        "postprocess": times.postprocess_seconds,
    }


class CollectorPauses:
    """The garbage collector's pauses by generation, as the histogram `infinity_gc_pause_seconds`.

    A collection holds the interpreter lock: every thread of the server waits for it, the event
    loop and every model's workers. Counted by a `gc.callbacks` hook in plain lists, without a
    lock (a collection can start inside any locked section, a scrape's included, and the hook runs
    on that same thread), and read at scrape time.
    """

    def __init__(self) -> None:
        self._started = 0.0
        self._counts = [[0] * (len(_PAUSE_BUCKETS) + 1) for _ in range(3)]  # per generation; the last is +Inf
        self._sums = [0.0] * 3

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds, generation = time.perf_counter() - self._started, info["generation"]
        self._counts[generation][bisect.bisect_left(_PAUSE_BUCKETS, seconds)] += 1
        self._sums[generation] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "infinity_gc_pause_seconds", "Garbage collector pauses, which stop every thread", labels=["generation"]
        )
        for generation, counts in enumerate(self._counts):
            cumulative = list(itertools.accumulate(counts))
            buckets = [(str(b), float(c)) for b, c in zip(_PAUSE_BUCKETS, cumulative, strict=False)]
            family.add_metric([str(generation)], [*buckets, ("+Inf", float(cumulative[-1]))], self._sums[generation])
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.collector_pauses = CollectorPauses()
        self.registry.register(self.collector_pauses)
        self.requests = Counter(
            "infinity_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "infinity_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.model_latency = Histogram(
            "infinity_model_request_seconds",
            "HTTP request latency by each model the request ran and its route",
            ["model", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batches = Counter("infinity_batches", "Batches run", ["model", "outcome"], registry=self.registry)
        self.batch_items = Counter("infinity_batch_items", "Items run in batches", ["model"], registry=self.registry)
        self.batch_tokens = Counter("infinity_batch_tokens", "Real tokens run", ["model"], registry=self.registry)
        self.batch_seconds = Histogram(
            "infinity_batch_seconds",
            "Time of one batch's forward pass",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "infinity_requests_in_flight",
            "HTTP requests being served (probes and scrapes aside)",
            registry=self.registry,
        )
        self.queue_depth = Gauge("infinity_queue_depth", "Items waiting", ["model"], registry=self.registry)
        self.queue_tokens = Gauge(
            "infinity_queue_tokens",
            "Summed cost of the items waiting (tokens, for text models)",
            ["model"],
            registry=self.registry,
        )
        self.batch_fill = Histogram(
            "infinity_batch_fill",
            "A batch's cost over max_batch_tokens",
            ["model"],
            buckets=_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.batch_padding = Histogram(
            "infinity_batch_padding_ratio",
            "Share of a batch's cost that is padding",
            ["model"],
            buckets=_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "infinity_stage_seconds",
            "Per request and model: prepare, queue, forward and postprocess time",
            ["model", "stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.loaded = Gauge("infinity_model_loaded", "1 when the model is loaded", ["model"], registry=self.registry)
        self.lifecycle = Counter(
            "infinity_model_lifecycle",
            "Model loads, failed loads, evictions, unloads and keep-alive expiries",
            ["model", "event"],
            registry=self.registry,
        )
        self.footprint = Gauge(
            "infinity_model_footprint_bytes", "Bytes a loaded model holds", ["model"], registry=self.registry
        )
        self.device_budget = Gauge(
            "infinity_device_memory_budget_bytes",
            "The memory budget models may hold on a device",
            ["device"],
            registry=self.registry,
        )
        self.device_charged = Gauge(
            "infinity_device_memory_charged_bytes",
            "Bytes charged to a device's budget: loaded models and loads under way",
            ["device"],
            registry=self.registry,
        )

        self.cache_lookups = Counter(
            "infinity_cache_lookups",
            "Distinct inputs looked up in a model's result cache, found (hit) or computed (miss)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.cache_hit_ratio = Gauge(
            "infinity_cache_hit_ratio",
            "Share of a model's cache lookups that were hits",
            ["model"],
            registry=self.registry,
        )
        self._cache_counts: dict[str, list[int]] = {}

    @contextlib.contextmanager
    def watching_the_collector(self) -> Iterator[None]:
        """Count the garbage collector's pauses while inside (the server's lifespan)."""
        gc.callbacks.append(self.collector_pauses)
        try:
            yield
        finally:
            gc.callbacks.remove(self.collector_pauses)

    def on_batch(self, stats: BatchStats) -> None:
        self.batches.labels(stats.model, "failed" if stats.failed else "ok").inc()
        self.batch_items.labels(stats.model).inc(stats.items)
        self.batch_tokens.labels(stats.model).inc(stats.tokens)
        self.batch_seconds.labels(stats.model).observe(stats.seconds)
        if stats.capacity > 0:
            self.batch_fill.labels(stats.model).observe(min(1.0, stats.cost / stats.capacity))
        if stats.cost > 0:
            self.batch_padding.labels(stats.model).observe(max(0.0, 1 - stats.tokens / stats.cost))

    def on_stages(self, stages: Iterable[StageTimes]) -> None:
        for times in stages:
            for stage, seconds in stage_seconds(times).items():
                self.stage_seconds.labels(times.model, stage).observe(seconds)

    def on_request(self, route: str, stages: Iterable[StageTimes], seconds: float) -> None:
        """A finished request's latency, once per model it ran (a configured name: bounded labels)."""
        for model in sorted({times.model for times in stages}):
            self.model_latency.labels(model, route).observe(seconds)

    def on_cache(self, lookups: Iterable[Lookup]) -> None:
        for lookup in lookups:
            self.cache_lookups.labels(lookup.model, "hit").inc(lookup.hits)
            self.cache_lookups.labels(lookup.model, "miss").inc(lookup.misses)
            counts = self._cache_counts.setdefault(lookup.model, [0, 0])
            counts[0] += lookup.hits
            counts[1] += lookup.misses
            if sum(counts):
                self.cache_hit_ratio.labels(lookup.model).set(counts[0] / sum(counts))

    def on_event(self, event: LifecycleEvent) -> None:
        self.lifecycle.labels(event.model, event.kind.value).inc()
        if event.kind == EventKind.LOADED:
            self.footprint.labels(event.model).set(event.bytes)
        elif event.kind != EventKind.LOAD_FAILED:
            self.footprint.labels(event.model).set(0)

    def exposition(self, engine: Registry) -> bytes:
        for info in engine.infos():
            self.queue_depth.labels(info.name).set(info.queue_depth)
            self.queue_tokens.labels(info.name).set(info.queue_tokens)
            self.loaded.labels(info.name).set(1 if info.state.value == "loaded" else 0)
        for usage in engine.memory():
            self.device_budget.labels(usage.device).set(usage.budget)
            self.device_charged.labels(usage.device).set(usage.charged)
        return generate_latest(self.registry)


class RequestMetrics:
    """Counts requests by route template and status, and their latency."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status, counted = time.perf_counter(), 500, False
        arrival.set(time.monotonic())  # the request's deadline counts from here

        def count() -> None:
            nonlocal counted
            if not counted:
                counted = True
                name = getattr(scope.get("route"), "path", "unmatched")
                self.metrics.requests.labels(name, str(status)).inc()
                self.metrics.latency.labels(name).observe(time.perf_counter() - started)

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                count()  # before the last bytes: a client holding its answer finds it counted
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            count()
