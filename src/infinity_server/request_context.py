"""Per request: its id, the engine's stage times as headers and metrics, its span, its log line.

- `X-Request-Id`: taken from the request when it is 1-128 characters of `[A-Za-z0-9._:-]`,
  otherwise a fresh one; always returned, and written on every log line of the request.
- Timing headers, in milliseconds, as Text Embeddings Inference names them: `x-total-time`
  (the whole request at the edge), `x-tokenization-time` (prepare), `x-queue-time` (waiting for a
  batch) and `x-inference-time` (forward and postprocess). When a request ran several model
  calls (media rerank embeds the query and the documents) the stage times are summed.
- `X-Cache`, where the model has a result cache: `hit` (nothing computed), `miss` (nothing found)
  or `partial`; the lookups are counted in `/metrics` (docs/caching.md).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity_server.logs import REQUEST_ID
from infinity_server.metrics import Metrics, stage_seconds
from infinity_server.routing import operation_in
from infinity_server.tracing import Tracing
from model_registry import CacheLookup, StageTimes, cache_outcome, record_cache_lookups, record_stages

access = logging.getLogger("infinity_server.access")

_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _VALID_ID.match(value):
            return str(value.decode("ascii"))
    return uuid.uuid4().hex


def timings_ms(stages: Sequence[StageTimes], total: float) -> dict[str, float]:
    """Milliseconds: `total`, and `tokenization`, `queue`, `inference` when a model ran."""
    found = {"total": total * 1000}
    if stages:
        sums = {"prepare": 0.0, "queue": 0.0, "forward": 0.0, "postprocess": 0.0}
        for times in stages:
            for stage, seconds in stage_seconds(times).items():
                sums[stage] += seconds
        found["tokenization"] = sums["prepare"] * 1000
        found["queue"] = sums["queue"] * 1000
        found["inference"] = (sums["forward"] + sums["postprocess"]) * 1000
    return {name: round(value, 3) for name, value in found.items()}


def timing_headers(stages: Sequence[StageTimes], total: float) -> dict[str, str]:
    return {f"x-{name}-time": f"{value:.3f}" for name, value in timings_ms(stages, total).items()}


class _Counted:
    """A request's stage times and cache lookups, each counted in the metrics once: those finished
    when the answer starts, then any finished later (a streamed body, a failure before any answer)."""

    def __init__(self, metrics: Metrics, stages: list[StageTimes], lookups: list[CacheLookup]) -> None:
        self.metrics, self.stages, self.lookups = metrics, stages, lookups
        self.stages_done = self.lookups_done = 0

    def flush(self) -> None:
        stages, lookups = len(self.stages), len(self.lookups)
        self.metrics.on_stages(self.stages[self.stages_done : stages])
        self.metrics.on_cache(self.lookups[self.lookups_done : lookups])
        self.stages_done, self.lookups_done = stages, lookups


class RequestContext:
    """The outermost middleware: every answer, errors included, carries the request id."""

    def __init__(self, app: ASGIApp, metrics: Metrics, tracing: Tracing | None, access_log: bool) -> None:
        self.app, self.metrics, self.tracing, self.access_log = app, metrics, tracing, access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        wall, started = time.time(), time.perf_counter()
        span = self.tracing.start(scope, wall) if self.tracing else None
        status = 500

        with record_stages() as stages, record_cache_lookups() as lookups:
            counted = _Counted(self.metrics, stages, lookups)

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    counted.flush()  # a client holding its answer finds its work in /metrics
                    headers = MutableHeaders(scope=message)
                    headers["x-request-id"] = rid
                    for name, value in timing_headers(stages, time.perf_counter() - started).items():
                        headers[name] = value
                    if (cached := cache_outcome(lookups)) is not None:
                        headers["x-cache"] = cached
                    parent = self.tracing.traceparent(span) if self.tracing is not None else None
                    if parent is not None:
                        headers["traceparent"] = parent
                await send(message)

            token = REQUEST_ID.set(rid)
            try:
                await self.app(scope, receive, sending)
            finally:
                counted.flush()
                self._finish(scope, stages, status, span, time.perf_counter() - started)
                REQUEST_ID.reset(token)

    def _finish(self, scope: Scope, stages: list[StageTimes], status: int, span: Any, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None)
        if stages:
            self.metrics.on_request(route or "unmatched", stages, seconds)
        if span is not None and self.tracing is not None:
            self.tracing.finish(span, scope, stages, status, time.time())
        if self.access_log:
            fields: dict[str, Any] = {
                "request_id": scope["state"]["request_id"],
                "method": scope["method"],
                "path": scope["path"],
                "route": route,
                "status": status,
                "ms": round(seconds * 1000, 3),
                "key": scope.get("state", {}).get("key_name"),
            }
            if stages:
                fields["models"] = sorted({t.model for t in stages})
                fields["timings_ms"] = timings_ms(stages, seconds)
            # Probes and scrapes (routes declared quiet) come every few seconds: debug level.
            op = operation_in(scope)
            level = logging.DEBUG if op is not None and op.quiet else logging.INFO
            access.log(level, "%s %s %d", scope["method"], scope["path"], status, extra=fields)
