"""The gate: an always-on front for model groups that scale to zero (docs/deploy.md, "Scale from
zero").

A group at zero replicas has no server to take its requests, nor to say that any are waiting. The
gate takes them instead: it finds the request's group (the `X-Gateway-Model-Name` header a
body-based router sets, else the JSON body's `model`), holds the request while the group has no
ready replica, polling the group's `/ready`, and forwards it once one answers. A request still
waiting after `wait_seconds` gets a 503 with `Retry-After`; none is refused at the socket. KEDA
reads each group's requests in the gate (`GET /gate/groups/<group>`, its metrics-api scaler) to
start the first replica and to scale on concurrency; Prometheus reads the same figures at
`/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infinity_server.routing import READY_PATH
from model_registry.errors import ConfigError

log = logging.getLogger("infinity_server.gate")

#: Headers that belong to one connection, never forwarded (RFC 9110, 7.6.1), and the length, which
#: the client library sets again for the body it sends.
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"proxy-authenticate", "proxy-authorization", "content-length"}
)
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
#: How often a waiting group's `/ready` is asked.
POLL_SECONDS = 0.25


class GateGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    #: The group's Service, e.g. http://release-infinity-server-embed:7997
    url: str = Field(pattern=r"^https?://")
    models: list[str] = Field(min_length=1)


class GateSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(default=7997, ge=1, le=65535)
    #: The header a body-based router copies the body's `model` into.
    header: str = "X-Gateway-Model-Name"
    #: How long a request waits for its group's first ready replica (a cold start: the pod's
    #: scheduling, the image pull, the model's load).
    wait_seconds: float = Field(default=180.0, gt=0, le=3600)
    #: `Retry-After` (seconds) on the 503 of a request that waited `wait_seconds` in vain.
    retry_after: int = Field(default=10, ge=1, le=3600)
    #: Requests one group may hold waiting; more are answered 503 at once.
    max_waiting: int = Field(default=1024, ge=1)
    #: The largest body the gate reads (it reads the whole body, for the model and to resend it).
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    #: The bodies of all the requests the gate holds at once (waiting or being sent); a request
    #: whose body would pass it is answered 503 at once.
    max_held_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    groups: list[GateGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_group_per_model(self) -> GateSettings:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"a group is listed twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
        seen: dict[str, str] = {}
        for group in self.groups:
            for model in group.models:
                if model in seen:
                    raise ValueError(f"model '{model}' is in two groups: {seen[model]} and {group.name}")
                seen[model] = group.name
        return self


def load_gate_settings(path: str | Path) -> GateSettings:
    """The gate's YAML (`gate:` at its top), validated: a mistake is a `ConfigError` naming it."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the gate's configuration {path}: {error}") from error
    if not isinstance(data, dict) or not isinstance(data.get("gate"), dict):
        raise ConfigError(f"{path} has no 'gate' section")
    try:
        return GateSettings.model_validate(data["gate"])
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise ConfigError(f"{path}: gate.{where}: {problem['msg']}") from None


@dataclass
class GroupState:
    """One group as the gate sees it: whether a replica answers, and the requests it holds."""

    group: GateGroup
    ready: bool = False
    waiting: int = 0
    in_flight: int = 0
    requests: int = 0
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)
    poller: asyncio.Task[None] | None = None

    def not_ready(self) -> None:
        self.ready = False
        self.ready_event.clear()


class Gate:
    def __init__(self, settings: GateSettings) -> None:
        self.settings = settings
        self.groups = {g.name: GroupState(g) for g in settings.groups}
        self.by_model = {m: g.name for g in settings.groups for m in g.models}
        self.client: httpx.AsyncClient | None = None
        #: Bytes of the bodies held now (`max_held_bytes`).
        self.held = 0
        self.metrics = CollectorRegistry()
        labels = ["group"]
        self.requests_total = Counter(
            "infinity_gate_requests", "Requests the gate took, by group", labels, registry=self.metrics
        )
        self.waiting = Gauge(
            "infinity_gate_waiting_requests", "Requests waiting for a ready replica", labels, registry=self.metrics
        )
        self.in_flight = Gauge(
            "infinity_gate_in_flight_requests",
            "Requests in the gate, waiting or forwarded",
            labels,
            registry=self.metrics,
        )
        self.timeouts = Counter(
            "infinity_gate_wait_timeouts", "Requests answered 503 after waiting in vain", labels, registry=self.metrics
        )
        self.ready_gauge = Gauge(
            "infinity_gate_group_ready",
            "1 when the group had a ready replica at the last look",
            labels,
            registry=self.metrics,
        )

    # ---- the group of a request ----------------------------------------------------------------

    def group_of(self, request: Request, body: bytes) -> GroupState | Response:
        model = request.headers.get(self.settings.header)
        if model is None and body:
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(body)
                if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
                    model = parsed["model"]
        if model is None:
            if len(self.groups) == 1:
                return next(iter(self.groups.values()))
            return _error(400, f"the request names no model (the {self.settings.header} header or the body's 'model')")
        name = self.by_model.get(model)
        if name is None:
            return _error(404, f"the model '{model}' does not exist behind this gate", code="model_not_found")
        return self.groups[name]

    # ---- waiting for a replica -----------------------------------------------------------------

    async def wait_ready(self, state: GroupState, deadline: float) -> bool:
        """Whether the group had a ready replica before `deadline`; one poller per group asks."""
        if state.ready:
            return True
        state.waiting += 1
        self.waiting.labels(state.group.name).inc()
        try:
            if state.poller is None or state.poller.done():
                state.poller = asyncio.create_task(self._poll(state))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.ready_event.wait(), remaining)
            return state.ready
        finally:
            state.waiting -= 1
            self.waiting.labels(state.group.name).dec()

    async def _poll(self, state: GroupState) -> None:
        """Ask the group's `/ready` until it answers 200, while any request waits."""
        assert self.client is not None, "This is a bug: the gate polls before its start"
        url = state.group.url.rstrip("/") + READY_PATH
        while state.waiting > 0 and not state.ready:
            try:
                answer = await self.client.get(url, timeout=2.0)
                if answer.status_code == 200:
                    state.ready = True
                    state.ready_event.set()
                    self.ready_gauge.labels(state.group.name).set(1)
                    log.info("group %s has a ready replica", state.group.name)
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(POLL_SECONDS)

    # ---- forwarding ----------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        try:
            body = await _read(request, self.settings.max_body_bytes)
        except _TooLarge:
            return _error(413, f"the body is larger than the gate's limit of {self.settings.max_body_bytes} bytes")
        except ClientDisconnect:
            return Response(status_code=499)
        found = self.group_of(request, body)
        if isinstance(found, Response):
            return found
        state = found
        name = state.group.name
        if not state.ready and state.waiting >= self.settings.max_waiting:
            return self._unavailable(name, f"{state.waiting} requests already wait for a replica of group '{name}'")
        if self.held + len(body) > self.settings.max_held_bytes:
            return self._unavailable(name, "the gate holds as many request bodies as it may")
        self.held += len(body)
        state.requests += 1
        self.requests_total.labels(name).inc()
        state.in_flight += 1
        self.in_flight.labels(name).inc()
        done = True
        try:
            deadline = time.monotonic() + self.settings.wait_seconds
            while True:
                if not await self.wait_ready(state, deadline):
                    self.timeouts.labels(name).inc()
                    return self._unavailable(
                        name, f"no replica of group '{name}' was ready within {self.settings.wait_seconds:g} s"
                    )
                try:
                    upstream = await self._send(state, request, body)
                    self.held -= len(body)
                    body = b""  # sent: no longer the gate's to hold
                except httpx.ConnectError:
                    # Nothing was sent: the replica went away (scaled down, restarted). Wait again.
                    state.not_ready()
                    self.ready_gauge.labels(name).set(0)
                    continue
                except httpx.HTTPError as error:
                    return _error(502, f"the replica of group '{name}' failed before answering: {type(error).__name__}")
                done = False  # the stream's end closes it and counts the request out
                return StreamingResponse(
                    upstream.aiter_raw(),
                    status_code=upstream.status_code,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP - {"content-length"}},
                    background=BackgroundTask(self._finish, state, upstream),
                )
        finally:
            self.held -= len(body)
            if done:
                self._out(state)

    async def _send(self, state: GroupState, request: Request, body: bytes) -> httpx.Response:
        assert self.client is not None, "This is a bug: the gate forwards before its start"
        url = state.group.url.rstrip("/") + request.url.path
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        outgoing = self.client.build_request(
            request.method, url, params=request.url.query or None, headers=headers, content=body
        )
        return await self.client.send(outgoing, stream=True)

    async def _finish(self, state: GroupState, upstream: httpx.Response) -> None:
        await upstream.aclose()
        self._out(state)

    def _out(self, state: GroupState) -> None:
        state.in_flight -= 1
        self.in_flight.labels(state.group.name).dec()

    def _unavailable(self, group: str, message: str) -> Response:
        answer = _error(503, f"{message}; retry after {self.settings.retry_after} s", code="group_starting")
        answer.headers["Retry-After"] = str(self.settings.retry_after)
        return answer

    # ---- the gate's own routes -----------------------------------------------------------------

    def figures(self, name: str) -> dict[str, Any]:
        state = self.groups[name]
        return {
            "group": name,
            "ready": state.ready,
            "waiting": state.waiting,
            "in_flight": state.in_flight,
            "requests": state.requests,
        }


class _TooLarge(Exception):
    pass


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str, *, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def create_gate_app(settings: GateSettings) -> Starlette:
    gate = Gate(settings)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def group(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in gate.groups:
            return _error(404, f"no group '{name}' behind this gate")
        return JSONResponse(gate.figures(name))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(gate.metrics), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(connect=2.0, read=None, write=60.0, pool=30.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False) as client:
            gate.client = client
            yield
            for state in gate.groups.values():
                if state.poller is not None:
                    state.poller.cancel()

    routes = [
        Route("/gate/health", health, methods=["GET"]),
        Route("/gate/groups/{name}", group, methods=["GET"]),
        Route("/gate/metrics", metrics, methods=["GET"]),
        Route("/{path:path}", gate.handle, methods=_METHODS),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gate = gate
    return app
