"""Name -> model handle: lazy loading, one load at a time per model, request execution.

A request goes: validate -> lease the model (loading it if needed) -> price and admit (or 429) ->
`prepare` on the model's own threads -> the model's queue -> its worker -> the request resolved on
the caller's event loop; every step after admission counts against the request's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from model_registry.adapters import Adapter
from model_registry.adapters.engines import check_engines
from model_registry.cache.results import caches_for
from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
from model_registry.errors import Cancelled, ModelUnavailable, UnknownModel
from model_registry.runtime.admission import client_priority, deadline_after, price, tokenizing_price
from model_registry.runtime.batching import BatchQueue, Request
from model_registry.runtime.handles import DeviceUsage, LifecycleEvent, ModelHandle
from model_registry.runtime.lifecycle import Lifecycle
from model_registry.runtime.timing import StageTimes, report
from model_registry.runtime.worker import BatchStats
from model_registry.tasks import classify, embedding, media_rerank, scoring, tokens
from model_registry.tasks import rerank as ranking
from model_registry.types import Capability, Item, Kind, ModelInfo, ModelState, Results

log = logging.getLogger(__name__)

T = TypeVar("T")


def _enqueue(queue: BatchQueue, request: Request) -> None:
    """`queue.put(request)`, its refusal (a full queue, an unloading model) failing the request."""
    try:
        queue.put(request)
    except Exception as error:
        request.fail(error)


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


class Registry:
    """The engine, usable in-process: `async with Registry.from_config(path) as reg: ...`."""

    def __init__(
        self,
        config: RegistryConfig,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_event: Callable[[LifecycleEvent], None] | None = None,
    ) -> None:
        self.config = config
        check_engines(config.models)  # a combination no engine runs stops the start, naming the fix
        self._handles = {spec.name: ModelHandle(spec) for spec in config.models}
        self._lifecycle = Lifecycle(config, self._handles, on_batch=on_batch, on_event=on_event)
        self._started = False
        self._from_files: dict[str, tuple[Kind, frozenset[Capability]]] = {}
        self._caches = caches_for(config.models)

    @classmethod
    def from_config(cls, source: str | Path | RegistryConfig | Mapping[str, Any], **kwargs: Any) -> Registry:
        """From a YAML path, a validated config or a mapping with `models` (and registry limits)."""
        if isinstance(source, RegistryConfig):
            config = source
        elif isinstance(source, Mapping):
            config = registry_config(source)
        else:
            config = load_config(source)
        return cls(config, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self, *, wait: bool = True) -> None:
        """Start the lifecycle, which loads the pinned models in the background.

        `wait` returns once each pinned model has loaded or failed once (a failed one is logged,
        marked and retried after `failed_retry_after`); a server starts with `wait=False`, so that
        it answers `/health` (and `/ready` with 503) while they load."""
        if self._started:
            return
        self._started = True
        self._lifecycle.start()
        if wait:
            await self._lifecycle.pinned_tried.wait()

    async def stop(self) -> None:
        await self._lifecycle.stop()
        self._started = False

    async def __aenter__(self) -> Registry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def pinned_tried(self) -> bool:
        """Every pinned model has loaded, or failed its first load, since the start."""
        return self._started and self._lifecycle.pinned_tried.is_set()

    @property
    def ready(self) -> bool:
        """Every pinned model loaded and its worker alive."""
        return self._started and all(
            h.state == ModelState.LOADED and h.worker is not None and h.worker.alive
            for h in self._handles.values()
            if h.spec.pin
        )

    # ---- information ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._handles)

    def info(self, name: str) -> ModelInfo:
        handle = self._handle(name)
        adapter = handle.adapter
        kind, capabilities = (adapter.kind, adapter.capabilities) if adapter else self._kind_from_files(handle.spec)
        return ModelInfo(
            name=name,
            kind=kind,
            capabilities=capabilities,
            backend=adapter.backend if adapter else handle.spec.backend,
            device=(adapter.device if adapter else None) or handle.spec.device,
            dtype=handle.spec.dtype if adapter is None or adapter.dtype is None else _dtype_name(adapter.dtype),
            state=handle.state,
            pinned=handle.spec.pin,
            max_length=adapter.max_length if adapter else None,
            dimensions=adapter.dimensions if adapter else None,
            footprint_bytes=handle.footprint if adapter and handle.state == ModelState.LOADED else None,
            last_used=handle.last_used,
            queue_depth=handle.queue.depth if handle.queue else 0,
            queue_tokens=handle.queue.pending_cost if handle.queue else 0,
            error=handle.error,
            extra=self._facts(handle),
            loading_seconds=None if handle.load_started is None else time.monotonic() - handle.load_started,
        )

    @staticmethod
    def _facts(handle: ModelHandle) -> dict[str, Any]:
        """A loaded model's own facts (`Adapter.describe`) and its batch budget."""
        if handle.adapter is None or handle.state != ModelState.LOADED:
            return {}
        budget = {"batch_budget": handle.budget.describe()} if handle.budget else {}
        return {**handle.adapter.describe(), **budget}

    def infos(self) -> list[ModelInfo]:
        return [self.info(name) for name in self._handles]

    def _kind_from_files(self, spec: ModelSpec) -> tuple[Kind, frozenset[Capability]]:
        """What a model that is not loaded is, from its configuration or its files (read once)."""
        if spec.name not in self._from_files:
            from model_registry.adapters import capabilities_of_kind, detect_served

            try:
                served = detect_served(spec)
            except Exception:  # an unreadable model says why when it loads; here it stays unknown
                log.debug("cannot detect the kind of '%s' from its files", spec.name, exc_info=True)
                if isinstance(spec.kind, Kind):
                    served = (spec.kind, capabilities_of_kind(spec.kind))
                else:
                    return Kind.DENSE, frozenset()
            self._from_files[spec.name] = served
        return self._from_files[spec.name]

    def _handle(self, name: str) -> ModelHandle:
        handle = self._handles.get(name)
        if handle is None:
            raise UnknownModel(name, list(self._handles))
        return handle

    # ---- loading -------------------------------------------------------------------------------

    async def load(self, name: str) -> ModelInfo:
        """Load `name` now (evicting idle models if needed); a failed model is retried at once."""
        await self._ensure_loaded(self._handle(name), retry_failed=True)
        return self.info(name)

    async def unload(self, name: str) -> ModelInfo:
        """Unload `name` once its work in flight is done; pinned models cannot be unloaded."""
        await self._lifecycle.unload_by_request(self._handle(name))
        return self.info(name)

    @property
    def events(self) -> list[LifecycleEvent]:
        """Recent loads, evictions, unloads and expiries, oldest first."""
        return list(self._lifecycle.events)

    def memory(self) -> list[DeviceUsage]:
        """Per device: its budget and the bytes charged to loaded and loading models."""
        return self._lifecycle.usage()

    async def _ensure_loaded(self, handle: ModelHandle, *, retry_failed: bool = False) -> Adapter:
        if not self._started:
            raise ModelUnavailable("the registry is not started (use 'async with Registry(...)' or start())")
        return await self._lifecycle.ensure_loaded(handle, retry_failed=retry_failed)

    async def _unload(self, handle: ModelHandle) -> None:
        await self._lifecycle.unload(handle)

    # ---- operations: each task's semantics live in the module named for it -------------------

    embed = embedding.embed
    embed_call = embedding.embed_call
    pages = embedding.pages
    rerank = ranking.rerank
    rerank_call = ranking.rerank_call
    score = scoring.score
    classify = classify.classify
    rerank_media = media_rerank.rerank_media
    tokenize = tokens.tokenize
    decode = tokens.decode

    # ---- what the tasks run on (`runner.Runner`) ---------------------------------------------------

    def spec(self, model: str) -> ModelSpec:
        """`model`'s configuration; `UnknownModel` for a name that is not configured."""
        return self._handle(model).spec

    async def adapter(self, model: str) -> Adapter:
        """`model`'s adapter, loading the model first if it is not loaded."""
        return await self._ensure_loaded(self._handle(model))

    async def run(
        self, model: str, items: Sequence[Item], *, priority: int | None = None, timeout: float | None = None
    ) -> Results:
        """Run items through `model`'s queue; the core every operation shares.

        The request is priced and admitted before its inputs are prepared: `Overloaded` (429) when
        the model cannot serve it before its deadline at its measured rate. A model with a result
        cache answers the items it holds and computes the others once (`result_cache`)."""
        cache = self._caches.get(model)
        if cache is None:
            return await self._compute(model, items, priority, timeout)
        identity = await cache.identity(await self._ensure_loaded(self._handle(model)))
        return await cache.run(identity, items, lambda missing: self._compute(model, missing, priority, timeout))

    async def _compute(self, model: str, items: Sequence[Item], priority: int | None, timeout: float | None) -> Results:
        handle = self._handle(model)
        if not self._started:
            raise ModelUnavailable("the registry is not started (use 'async with Registry(...)' or start())")
        deadline = deadline_after(timeout or self.config.request_timeout)
        async with self._lifecycle.lease(handle) as lease:
            rank = lease.queue.priority_for(len(items), priority)
            cost = price(items, lease.adapter.max_length)
            reservation = lease.backlog.admit(cost, rank, deadline - time.monotonic())
            try:
                prepare_start = time.time()
                seconds = deadline - time.monotonic()
                prepared = await lease.stage.run(items, seconds, reads=tokenizing_price(items))
                reservation.reprice(sum(p.cost for p in prepared))
                request = Request.on_loop(prepared, priority=rank, deadline=deadline)
                enqueued = time.time()
                # Queued once this turn of the event loop is over, not now: the loop's own work
                # until it sleeps (this request's wait, the tasks it woke) would otherwise run
                # beside the forward pass it starts, on the cores the engine's threads are using.
                if not lease.worker.run_here(request):
                    asyncio.get_running_loop().call_soon(_enqueue, lease.queue, request)
                results = await request.outcome()
            finally:
                reservation.release()
        if len(results) != len(items):
            raise Cancelled("the request was cancelled before all of its items ran")
        tokens = sum(p.tokens for p in prepared)
        report(StageTimes(model, len(items), tokens, prepare_start, enqueued, time.time(), tuple(request.batches)))
        return Results(tuple(results), tokens, tuple(p.tokens for p in sorted(prepared, key=lambda p: p.index)))

    def client_priority(self, requested: int | None, *, granted: bool) -> int | None:
        """The priority a client's request may have: lowering is free; raising it above the default
        needs `granted` (the key's `priority` scope) or the registry's `allow_client_priority`."""
        return client_priority(requested, may_raise=granted or self.config.allow_client_priority)

    async def on_model_threads(self, model: str, fn: Callable[[], T]) -> T:
        """`fn` on `model`'s own prepare threads, where its requests' tokenizing runs, under a lease:
        an eviction would stop those threads, cancelling `fn` with the request still waiting."""
        async with self._lifecycle.lease(self._handle(model)) as lease:
            return await lease.stage.call(fn)
