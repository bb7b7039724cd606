"""Model lifecycle: load on demand inside a memory budget, evict the least recently used, expire.

Rules, per device (CPU RAM, or one CUDA device's memory):
- Every loaded or loading model is charged its footprint against the device's budget: an estimate
  while it loads (its last measured footprint, else `Adapter.estimate`), its measured footprint
  once loaded.
- Before a load, the least recently used idle models on the device are evicted until the new one
  fits. Pinned models, models with work queued, running or about to be queued, and models being
  loaded are never evicted. When only busy models stand in the way, the load waits up to
  `room_wait` seconds for one to go idle, then fails with `InsufficientMemory` (a 503) saying
  what was needed, what was free and which models were busy. Such a model is not marked failed.
- One load at a time per model: concurrent callers wait on the same future. A failed load is
  remembered with its error and retried by a request that comes after the back-off.
- Pinned models load in the background once the lifecycle starts, all at once; a pinned load
  that fails is retried after `failed_retry_after` seconds until it succeeds.
- A model with `keep_alive` is unloaded once idle for that many seconds. An operator's unload
  holds new callers back while the work in flight finishes; they then load the model again.
- A request holds its model through a `lease` (one owner of the in-flight count and the LRU
  stamp, released however the request ends). A load that fails gives back what it loaded and its
  charge; a load that times out keeps its charge until its thread has finished and been unloaded.

All bookkeeping runs on the event loop; loading and unloading run on threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from model_registry.adapters import Adapter, LoadOptions, create_adapter
from model_registry.backends import build_process, devices
from model_registry.config import ModelSpec, RegistryConfig
from model_registry.errors import InsufficientMemory, ModelUnavailable, RegistryError, UnsupportedOperation
from model_registry.runtime import heap, memory
from model_registry.runtime.assembly import (
    assemble,
    batch_tokens,
    budget_candidates,
    fixed_budget,
    measured,
    memory_device_of,
    release,
    release_quietly,
    retire,
)
from model_registry.runtime.handles import DeviceUsage, EventKind, Lease, LifecycleEvent, ModelHandle
from model_registry.runtime.warmup import Budget, measure_budget, measure_rate
from model_registry.runtime.worker import BatchStats
from model_registry.types import ModelState

log = logging.getLogger(__name__)

_DRAIN_POLL = 0.02
#: Least seconds between two rounds of retrying failed pinned loads (`failed_retry_after` may be 0).
_PIN_RETRY_FLOOR = 1.0

T = TypeVar("T")

__all__ = ["DeviceUsage", "EventKind", "Lease", "Lifecycle", "LifecycleEvent", "ModelHandle"]


def timed_warm_up(adapter: Adapter, spec: ModelSpec, device: str, max_seconds: float) -> Budget:
    """The model's batch budget and its rate, timed as batches of the device (never while a load
    measures its memory there): several budgets for `max_batch_tokens: auto`, else one batch at
    the budget it has (no rate when no batch of it could run). One model is timed at a time on a
    device, beside the batches of those that serve."""
    with devices.timing(device), devices.gate(device).shared():
        if measured(spec):
            budget = measure_budget(adapter, budget_candidates(device), max_seconds)
            if budget is not None:
                return budget
        fixed = fixed_budget(spec, device)
        return dataclasses.replace(fixed, rate=measure_rate(adapter, fixed.tokens))


class Lifecycle:
    """Owns the transitions of every `ModelHandle`: load, evict, unload, expire."""

    def __init__(
        self,
        config: RegistryConfig,
        handles: Mapping[str, ModelHandle],
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_event: Callable[[LifecycleEvent], None] | None = None,
    ) -> None:
        self.config = config
        self.handles = handles
        self.events: deque[LifecycleEvent] = deque(maxlen=10_000)
        self._on_batch = on_batch
        self._on_event = on_event
        self._budgets: dict[str, int] = {}
        self._admission = asyncio.Lock()
        self._stamps = itertools.count(1)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._pinner: asyncio.Task[None] | None = None
        #: Set once every pinned model has been tried once (loaded or failed).
        self.pinned_tried = asyncio.Event()
        #: Per device, bytes still held by loads that timed out while their thread goes on.
        self._late: dict[str, int] = {}
        #: Set by `stop`: loads in flight give up, as at their deadline, instead of holding it up.
        self._stopping = asyncio.Event()

    # ---- bookkeeping ---------------------------------------------------------------------------

    def budget(self, device: str) -> int:
        """The device's budget in bytes, fixed the first time the device is asked about."""
        if device not in self._budgets:
            self._budgets[device] = memory.device_budget(self.config.memory_budget, device)
        return self._budgets[device]

    def usage(self) -> list[DeviceUsage]:
        return [DeviceUsage(d, b, self._charged(d)) for d, b in sorted(self._budgets.items())]

    def touch(self, handle: ModelHandle) -> None:
        handle.touched = next(self._stamps)
        handle.used_at = time.monotonic()
        handle.last_used = time.time()

    def _charged(self, device: str, *, besides: ModelHandle | None = None) -> int:
        held = sum(h.charged for h in self.handles.values() if h.device == device and h is not besides)
        return held + self._late.get(device, 0)

    def _emit(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)

    # ---- leases --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, handle: ModelHandle) -> AsyncIterator[Lease]:
        """The model, loaded and held for one request: never evicted or unloaded while held.

        Counted before the first await after the load, so nothing can evict the model between its
        load and its use; released however the request ends."""
        await self.ensure_loaded(handle)
        adapter, queue, backlog, stage, worker = (
            handle.adapter,
            handle.queue,
            handle.backlog,
            handle.stage,
            handle.worker,
        )
        if adapter is None or queue is None or backlog is None or stage is None or worker is None:
            raise RuntimeError(f"This is a bug: the loaded model '{handle.spec.name}' lacks its queue or worker")
        handle.inflight += 1
        self.touch(handle)
        try:
            yield Lease(adapter, queue, backlog, stage, worker)
        finally:
            handle.inflight -= 1
            self.touch(handle)

    # ---- loading -------------------------------------------------------------------------------

    async def ensure_loaded(self, handle: ModelHandle, *, retry_failed: bool = False) -> Adapter:
        """The model's adapter, loading it first (once, however many callers ask) if needed.

        Returns without yielding to the event loop once the model is loaded and not draining, so
        the caller can count itself in `inflight` before anything can evict the model.
        """
        while True:
            if handle.state == ModelState.LOADED and handle.adapter is not None:
                if not handle.draining:
                    return handle.adapter
                # Being emptied for another model: wait for the eviction (or its cancellation).
                await handle.undrained.wait()
                continue
            self._check_back_off(handle, retry_failed)
            if handle.loading is None:
                handle.loading = asyncio.get_running_loop().create_future()
                self._tasks.add(task := asyncio.create_task(self._load(handle, handle.loading)))
                task.add_done_callback(self._tasks.discard)
            handle.waiting += 1
            try:
                await asyncio.shield(handle.loading)
            finally:
                handle.waiting -= 1

    def _check_back_off(self, handle: ModelHandle, retry_failed: bool) -> None:
        if handle.state == ModelState.FAILED and not retry_failed and handle.loading is None:
            waited = time.monotonic() - handle.failed_at
            if waited < self.config.failed_retry_after:
                raise ModelUnavailable(
                    f"the model '{handle.spec.name}' failed to load: {handle.error} "
                    f"(next attempt in {self.config.failed_retry_after - waited:.0f}s)"
                )

    async def _load(self, handle: ModelHandle, done: asyncio.Future[None]) -> None:
        spec = handle.spec
        started = time.perf_counter()
        async with handle.lock:
            handle.state, handle.error = ModelState.LOADING, None
            handle.load_started = time.monotonic()
            try:
                adapter, budget = await self._bring_up(handle)
            except Exception as error:
                self._failed(handle, error)
                if isinstance(error, InsufficientMemory):
                    done.set_exception(error)
                else:
                    done.set_exception(ModelUnavailable(f"the model '{spec.name}' failed to load: {handle.error}"))
                done.exception()  # retrieved here so that an unawaited failure is not reported as lost
            else:
                assemble(handle, adapter, self.config, self._on_batch, budget)
                await asyncio.to_thread(heap.freeze)
                self.touch(handle)
                seconds = time.perf_counter() - started
                log.info("model '%s' loaded in %.2fs (%s)", spec.name, seconds, memory.format_bytes(handle.footprint))
                self._emit(
                    LifecycleEvent(EventKind.LOADED, spec.name, handle.device, handle.footprint, time.time(), seconds)
                )
                done.set_result(None)
            finally:
                handle.loading = handle.load_started = None

    def _failed(self, handle: ModelHandle, error: Exception) -> None:
        handle.charged = 0
        handle.error = str(error) if isinstance(error, RegistryError) else f"{type(error).__name__}: {error}"
        if isinstance(error, InsufficientMemory):
            # Room may come at any moment; the next request tries again, with no back-off.
            handle.state = ModelState.UNLOADED
            log.warning("model '%s' was not loaded: %s", handle.spec.name, handle.error)
            self._emit(
                LifecycleEvent(EventKind.LOAD_FAILED, handle.spec.name, handle.device, 0, time.time(), 0, handle.error)
            )
            return
        handle.state, handle.failed_at = ModelState.FAILED, time.monotonic()
        limit = self.config.load_timeout
        if isinstance(error, asyncio.TimeoutError):
            handle.error = f"loading took longer than {limit:g}s"
        elif handle.load_started is not None and handle.failed_at >= handle.load_started + limit:
            # A step that gave up at the deadline itself (a build stopped then): a timeout too.
            handle.error = f"loading took longer than {limit:g}s: {handle.error}"
        level = logging.WARNING if self._stopping.is_set() else logging.ERROR  # a stop is not the model's fault
        log.log(level, "model '%s' failed to load: %s", handle.spec.name, handle.error)
        self._emit(
            LifecycleEvent(EventKind.LOAD_FAILED, handle.spec.name, handle.device, 0, time.time(), 0, handle.error)
        )

    async def _bring_up(self, handle: ModelHandle) -> tuple[Adapter, Budget]:
        """Build the adapter, make room for its estimate, load it, charge what it measured, and
        time warm-up batches for its budget and admission's first rate."""
        spec = handle.spec
        deadline = time.monotonic() + self.config.load_timeout
        build_process.DEADLINE.set(deadline)  # an export still running then is killed, not left behind
        adapter = await self._off_loop(deadline, None, create_adapter, spec)
        handle.device = memory_device_of(spec, adapter)
        options = LoadOptions(
            device=spec.device,
            dtype=spec.dtype,
            backend=spec.backend,
            quantize=spec.quantize,
            cache_dir=self.config.engine_cache,
            max_batch_tokens=batch_tokens(spec, handle.device),
            media=self.config.media,
            cuda_graphs=spec.cuda_graphs,
        )
        # Estimating reads weight files (sizes, maybe headers): off the loop like the load itself.
        need = handle.footprint
        if not need:
            estimate: int | None = await self._off_loop(deadline, None, adapter.estimate, options)
            need = estimate or 0
        await self._fit(handle, need, real=True)
        try:
            measured = await self._off_loop(deadline, handle, memory.load_and_measure, adapter, options, handle.device)
        except asyncio.TimeoutError:
            raise  # the charge moved to the late load in `_off_loop`
        except Exception:
            # Whatever part of the model made it into memory goes back before the charge does.
            await asyncio.to_thread(release_quietly, adapter, handle.device)
            handle.charged = 0
            raise
        except BaseException:
            handle.charged = 0
            raise
        handle.footprint = measured
        try:
            await self._fit(handle, measured, real=False)
        except InsufficientMemory:
            await asyncio.to_thread(release, adapter, handle.device)
            raise
        return adapter, await self._warm_up(handle, adapter, deadline)

    async def _warm_up(self, handle: ModelHandle, adapter: Adapter, deadline: float) -> Budget:
        """The model's budget and rate from timed batches; a batch that fails leaves the rate
        unmeasured (admission then probes with a few batches' worth, as `Backlog` says) and the
        budget fixed, it does not fail the load."""
        spec, device, seconds = handle.spec, handle.device, self.config.max_batch_seconds
        try:
            return await self._off_loop(deadline, handle, timed_warm_up, adapter, spec, device, seconds)
        except asyncio.TimeoutError:
            raise
        except Exception:
            log.warning("no timed warm-up for the model '%s'", spec.name, exc_info=True)
            return fixed_budget(spec, device)

    async def _off_loop(self, deadline: float, loading: ModelHandle | None, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a thread, within the load deadline and until `stop`. A thread cannot be
        stopped: after a timeout, the memory `loading` was charged stays charged (to the device,
        not to the model) until the thread has finished and whatever it loaded is unloaded."""
        work = on_own_thread(fn, *args)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            timeout = max(0.0, deadline - time.monotonic())
            await asyncio.wait((work, stopping), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if work.done():
            return work.result()
        work.add_done_callback(lambda late: late.cancelled() or late.exception())  # its error has no one to go to
        if loading is not None:
            device, held, adapter = loading.device, loading.charged, args[0]
            assert isinstance(adapter, Adapter), "This is a bug: a timed load must be given its adapter"
            loading.charged = 0
            self._late[device] = self._late.get(device, 0) + held
            task = asyncio.ensure_future(self._unload_late(work, adapter, device, held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._stopping.is_set():
            raise ModelUnavailable("the server stopped while it loaded")
        raise asyncio.TimeoutError

    async def _unload_late(self, work: asyncio.Future[Any], adapter: Adapter, device: str, held: int) -> None:
        try:
            await asyncio.gather(work, return_exceptions=True)
            await asyncio.to_thread(release_quietly, adapter, device)
        finally:
            self._late[device] -= held

    # ---- making room ---------------------------------------------------------------------------

    async def _fit(self, handle: ModelHandle, need: int, *, real: bool) -> None:
        """Evict LRU idle models on the handle's device until `need` bytes fit, then charge them.

        `real` also requires the device to have that much free memory now (other processes use
        it too); it is off once the model is loaded, since its memory is then already taken.
        When only busy models stand in the way, waits up to `room_wait` seconds for one to go
        idle, without holding the admission lock, so that loads that can fit are not held up.
        """
        budget = self.budget(handle.device)
        if need > budget:
            raise self._no_room(handle, need, budget - self._charged(handle.device, besides=handle))
        give_up = time.monotonic() + self.config.room_wait
        while True:
            async with self._admission:  # two loads never count the same free bytes
                room = await self._make_room(handle, need, real=real)
            if room is None:
                return
            if time.monotonic() >= give_up or not self._may_go_idle(handle.device, besides=handle):
                raise self._no_room(handle, need, room)
            await asyncio.sleep(_DRAIN_POLL)

    async def _make_room(self, handle: ModelHandle, need: int, *, real: bool) -> int | None:
        """Evict idle models, least recently used first, until `need` fits: then charge it and
        return None; else return the room there is."""
        device, budget = handle.device, self.budget(handle.device)
        while True:
            room = budget - self._charged(device, besides=handle)
            if real:
                room = min(room, memory.probe(device).free)
            if need <= room:
                handle.charged = need
                return None
            victims = self._victims(device, besides=handle)
            if not victims:
                return room
            candidates = tuple((v.spec.name, v.touched) for v in victims)
            await self.unload(victims[0], kind=EventKind.EVICTED, candidates=candidates)

    def _may_go_idle(self, device: str, *, besides: ModelHandle) -> bool:
        """Whether a model holding room on `device` may become evictable: a loaded or loading one
        (a load in progress, its warm-up included, is busy only for a while), never a pinned one."""
        return any(
            h.device == device
            and h is not besides
            and not h.spec.pin
            and h.state in (ModelState.LOADED, ModelState.LOADING)
            for h in self.handles.values()
        )

    def _victims(self, device: str, *, besides: ModelHandle) -> list[ModelHandle]:
        idle = [h for h in self.handles.values() if h.device == device and h is not besides and h.evictable]
        return sorted(idle, key=lambda h: h.touched)

    def _no_room(self, handle: ModelHandle, need: int, room: int) -> InsufficientMemory:
        busy = [
            h.spec.name + (" (pinned)" if h.spec.pin else "")
            for h in self.handles.values()
            if h.device == handle.device and h is not handle and h.charged and not h.evictable
        ]
        fmt = memory.format_bytes
        late = self._late.get(handle.device, 0)
        held = f"; {fmt(late)} is held by loads that timed out and are still running (load_timeout)" if late else ""
        return InsufficientMemory(
            f"not enough memory on {handle.device} for the model '{handle.spec.name}': it needs {fmt(need)}, "
            f"{fmt(max(0, room))} is free within the budget of {fmt(self.budget(handle.device))}, and the models "
            f"holding the rest cannot be evicted now: {', '.join(busy) or 'none'}{held}. Retry later, "
            "or raise memory_budget, pin fewer models or serve this one on another device"
        )

    # ---- unloading -----------------------------------------------------------------------------

    async def unload(
        self,
        handle: ModelHandle,
        *,
        kind: EventKind = EventKind.UNLOADED,
        drain: float = 0.0,
        candidates: tuple[tuple[str, int], ...] = (),
    ) -> None:
        """Stop the model's worker and give its memory back.

        `drain` waits up to that many seconds for queued and running work to finish first. An
        eviction or expiry is abandoned if the model became busy meanwhile.
        """
        if handle.loading is not None:
            await asyncio.gather(asyncio.shield(handle.loading), return_exceptions=True)
        if drain and handle.state == ModelState.LOADED:
            await self._drain(handle, drain)
        async with handle.lock:
            if kind != EventKind.UNLOADED and not handle.evictable:
                return
            worker, adapter, stage = handle.worker, handle.adapter, handle.stage
            if adapter is None:
                return
            handle.worker = handle.adapter = handle.queue = None
            handle.backlog = handle.stage = None
            if stage is not None:
                stage.stop()
            handle.state = ModelState.UNLOADED
            if handle.draining:
                handle.draining = False
                handle.undrained.set()
            started, freed = time.perf_counter(), handle.charged
            held: list[Any] = [worker, adapter]
            del worker, adapter, stage
            try:
                await asyncio.to_thread(retire, held, handle.device)
            finally:
                handle.charged = 0
            seconds = time.perf_counter() - started
        log.info("model '%s' %s (%s freed)", handle.spec.name, kind.value, memory.format_bytes(freed))
        self._emit(LifecycleEvent(kind, handle.spec.name, handle.device, freed, time.time(), seconds, "", candidates))

    async def _drain(self, handle: ModelHandle, seconds: float) -> None:
        """Hold new callers back and wait up to `seconds` for the work in flight to finish."""
        deadline = time.monotonic() + seconds
        handle.draining = True
        handle.undrained.clear()
        try:
            # Polled: work finishes on the worker's threads, which signal nothing to the loop.
            while handle.busy and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(_DRAIN_POLL)
        finally:
            # Whether or not the unload follows, waiting callers re-check the model's state.
            handle.draining = False
            handle.undrained.set()

    async def unload_by_request(self, handle: ModelHandle) -> None:
        """An operator's unload: refused for pinned models, waits for work in flight to finish."""
        if handle.spec.pin:
            raise UnsupportedOperation(
                f"the model '{handle.spec.name}' is pinned (always loaded); remove 'pin: true' from its "
                "configuration to unload it",
                param="model",
            )
        await self.unload(handle, drain=self.config.request_timeout)

    # ---- background work: pinned loads, keep-alive ---------------------------------------------

    def start(self) -> None:
        """Start expiring idle models and loading the pinned ones, in the background."""
        self._stopping.clear()
        timed = [h.spec.keep_alive for h in self.handles.values() if h.spec.keep_alive and not h.spec.pin]
        if timed and self._keeper is None:
            period = min(5.0, max(0.05, min(timed) / 4))
            self._keeper = asyncio.create_task(self._keep_alive(period))
        if self._pinner is None:
            pinned = [h for h in self.handles.values() if h.spec.pin]
            self._pinner = asyncio.create_task(self._keep_pinned(pinned))

    async def _keep_pinned(self, pinned: list[ModelHandle]) -> None:
        """Load every pinned model, all at once (a slow one holds no other back), and retry the
        failed ones after the back-off until each is loaded."""
        while True:
            await asyncio.gather(*(self._try_load(h) for h in pinned if h.state != ModelState.LOADED))
            self.pinned_tried.set()
            if all(h.state == ModelState.LOADED for h in pinned):
                return
            await asyncio.sleep(max(self.config.failed_retry_after, _PIN_RETRY_FLOOR))

    async def _try_load(self, handle: ModelHandle) -> None:
        # A failure is logged and recorded on the handle (`/ready`, `/models`) by the load itself.
        with contextlib.suppress(RegistryError):
            await self.ensure_loaded(handle, retry_failed=True)

    async def _keep_alive(self, period: float) -> None:
        """Expire idle models every `period` seconds; a failed unload is logged, never fatal."""
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for handle in list(self.handles.values()):
                limit = handle.spec.keep_alive
                if limit and handle.evictable and now - handle.used_at >= limit:
                    try:
                        await self.unload(handle, kind=EventKind.EXPIRED)
                    except Exception:
                        log.exception("expiring the idle model '%s' failed; it is retried later", handle.spec.name)

    async def stop(self) -> None:
        self._stopping.set()  # before the unloads below wait for loads in flight
        for task in (self._keeper, self._pinner):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._keeper = self._pinner = None
        self.pinned_tried.clear()
        for handle in self.handles.values():
            await self.unload(handle)


def on_own_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` on a thread of its own, which ends with it.

    A load runs torch's parallel operators, and the OpenMP pool they start belongs to the calling
    thread for as long as it lives. A pool kept beside the one that computes (`devices.torch_thread`)
    means more OpenMP threads than cores, and libgomp then stops its threads spinning between
    operators: on 2 cores every later forward pass took 1.3x as long. A thread that ends takes its
    pool with it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()  # as `asyncio.to_thread` hands the caller's on

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, *args), None)
        except BaseException as error:  # handed to the awaiting task, as `asyncio.to_thread` does
            outcome = (None, error)
        with contextlib.suppress(RuntimeError):  # the loop closed while this ran: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=f"load-{getattr(fn, '__name__', 'work')}", daemon=True).start()
    return future
