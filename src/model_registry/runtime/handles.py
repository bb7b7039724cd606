"""A model's handle and the lifecycle's records: what the registry knows about each model.

The transitions themselves (load, evict, unload, expire) live in `lifecycle.py`.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from model_registry.adapters import Adapter
from model_registry.config import ModelSpec
from model_registry.runtime.admission import Backlog
from model_registry.runtime.batching import BatchQueue
from model_registry.runtime.warmup import Budget
from model_registry.runtime.worker import PrepareStage, Worker
from model_registry.types import ModelState


@dataclass(eq=False)
class ModelHandle:
    """One configured model and, while loaded, its adapter, queue and worker."""

    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    adapter: Adapter | None = None
    queue: BatchQueue | None = None
    worker: Worker | None = None
    backlog: Backlog | None = None
    stage: PrepareStage | None = None
    #: The batch budget of the current load, and how it was chosen.
    budget: Budget | None = None
    error: str | None = None
    failed_at: float = 0.0
    #: When the load in progress started (`time.monotonic()`), None when none is.
    load_started: float | None = None
    last_used: float | None = None
    inflight: int = 0
    loading: asyncio.Future[None] | None = field(default=None, repr=False)
    #: The device whose memory the model uses ('cpu' or 'cuda:N'), known once a load starts.
    device: str = "cpu"
    #: Bytes measured at the last load (0 before any).
    footprint: int = 0
    #: Bytes held against the device budget now: the estimate while loading, then the footprint.
    charged: int = 0
    #: LRU stamp: a registry-wide counter, bumped whenever the model is used.
    touched: int = 0
    used_at: float = 0.0
    #: Callers waiting on `loading`: they are about to use the model, so it is busy.
    waiting: int = 0
    #: Chosen for eviction while busy: new callers wait on `undrained`, work in flight finishes.
    draining: bool = False
    undrained: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def busy(self) -> bool:
        """Work is queued, running, or about to be queued (callers past or inside the load wait).

        Every queued or running request has a caller counted in `inflight` until its results are
        delivered. The worker's own flag is not consulted: it lags the delivery by a moment, and a
        batch whose callers have all gone is finished safely anyway (the worker's threads are
        joined before the adapter is unloaded)."""
        queued = self.queue is not None and self.queue.depth > 0
        return self.inflight > 0 or self.waiting > 0 or queued

    @property
    def evictable(self) -> bool:
        return self.state == ModelState.LOADED and not self.spec.pin and not self.busy


@dataclass(frozen=True, slots=True)
class Lease:
    """A loaded model held for one request: it cannot be evicted or unloaded while leased.

    Given by `Lifecycle.lease` only, which counts the holder in `inflight` and releases it
    whatever happens; the parts are those of the load the lease was taken on."""

    adapter: Adapter
    queue: BatchQueue
    backlog: Backlog
    stage: PrepareStage
    worker: Worker


class EventKind(str, enum.Enum):
    LOADED = "loaded"
    LOAD_FAILED = "load_failed"
    EVICTED = "evicted"
    UNLOADED = "unloaded"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One transition. An eviction lists the idle candidates it chose from, with their LRU stamps,
    so the order can be audited."""

    kind: EventKind
    model: str
    device: str
    bytes: int
    at: float
    seconds: float = 0.0
    reason: str = ""
    candidates: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    device: str
    budget: int
    charged: int
