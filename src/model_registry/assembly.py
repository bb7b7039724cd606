"""What a loaded model is made of (queue, worker, backlog, prepare stage): built and given back.

The lifecycle decides when; this module knows how. Nothing here touches the memory budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from model_registry import devices, memory
from model_registry.adapters import Adapter
from model_registry.admission import COLD_START_COST, Backlog
from model_registry.batching import BatchQueue
from model_registry.config import ModelSpec, RegistryConfig
from model_registry.handles import ModelHandle
from model_registry.types import Kind, ModelState
from model_registry.warmup import Rate
from model_registry.worker import BatchStats, PrepareStage, Worker

log = logging.getLogger(__name__)

_CPU_BATCH_TOKENS = 1024
_GPU_BATCH_TOKENS = 16384


def assemble(
    handle: ModelHandle,
    adapter: Adapter,
    config: RegistryConfig,
    on_batch: Callable[[BatchStats], None] | None,
    rate: Rate | None = None,
) -> None:
    """Give a freshly loaded `adapter` its queue, worker, backlog and prepare stage: it serves.

    `rate`, timed at load, seeds the queue's measured rate, so admission plans by deadline from
    the first request on."""
    tokens = batch_tokens(handle.spec, adapter)
    queue = BatchQueue(
        max_batch_tokens=tokens,
        max_items=handle.spec.max_queued_items,
        batch_cost=adapter.batch_cost,
        small_request_items=config.small_request_items,
        aging=config.aging_seconds,
    )
    if rate is not None:
        queue.record(rate.cost, rate.seconds)
    worker = Worker(handle.spec.name, adapter, queue, on_batch=on_batch)
    worker.start()
    handle.backlog = Backlog(
        lambda: queue.rate, headroom=config.admission_headroom, probe=max(4 * tokens, COLD_START_COST)
    )
    handle.stage = PrepareStage(handle.spec.name, adapter, config.prepare_threads)
    handle.adapter, handle.queue, handle.worker = adapter, queue, worker
    handle.state = ModelState.LOADED


def memory_device_of(spec: ModelSpec) -> str:
    # The fake model holds host memory whatever device it is given.
    return "cpu" if spec.kind == Kind.FAKE else devices.memory_device(spec.device)


def batch_tokens(spec: ModelSpec, adapter: Adapter | None = None) -> int:
    """The model's batch budget: its own `max_batch_tokens`, else a default for its device."""
    if spec.max_batch_tokens:
        return spec.max_batch_tokens
    return default_batch_tokens((adapter.device if adapter else None) or spec.device)


def default_batch_tokens(device: str) -> int:
    """The batch budget of a model on `device` that sets none."""
    return _GPU_BATCH_TOKENS if device.startswith("cuda") else _CPU_BATCH_TOKENS


def release(adapter: Adapter, device: str) -> None:
    """Unload `adapter` and give its memory back to the system (see `memory.release`)."""
    adapter.unload()
    del adapter
    memory.release(device)


def retire(held: list[Any], device: str) -> None:
    """Stop a loaded model's worker, unload its adapter and give its memory back.

    `held` is `[worker, adapter]` and holds their last references: they are taken out of it here,
    so that nothing else keeps them alive through the collection in `memory.release` (a thread
    pool keeps a call's arguments until the call returns, and the worker and its queue form a
    reference cycle that only that collection frees).
    """
    worker, adapter = held
    held.clear()
    if worker is not None:
        worker.stop()
    del worker
    adapter.unload()
    del adapter
    memory.release(device)


def release_quietly(adapter: Adapter, device: str) -> None:
    """`release` after a failed load: the adapter may be half loaded, so its unload may fail."""
    try:
        release(adapter, device)
    except Exception:
        log.exception("unloading the remains of a failed load of %s raised", type(adapter).__name__)
