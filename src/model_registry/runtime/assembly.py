"""What a loaded model is made of (queue, worker, backlog, prepare stage): built and given back.

The lifecycle decides when; this module knows how. Nothing here touches the memory budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from model_registry.adapters import Adapter
from model_registry.adapters.static import ENGINE as STATIC_ENGINE
from model_registry.backends import devices
from model_registry.config import ModelSpec, RegistryConfig
from model_registry.runtime import memory
from model_registry.runtime.admission import COLD_START_COST, Backlog
from model_registry.runtime.batching import BatchQueue
from model_registry.runtime.handles import ModelHandle
from model_registry.runtime.warmup import Budget, Rate
from model_registry.runtime.worker import BatchStats, PrepareStage, Worker
from model_registry.types import Kind, ModelState

log = logging.getLogger(__name__)

_CPU_BATCH_TOKENS = 1024
_GPU_BATCH_TOKENS = 16384


def assemble(
    handle: ModelHandle,
    adapter: Adapter,
    config: RegistryConfig,
    on_batch: Callable[[BatchStats], None] | None,
    budget: Budget,
) -> None:
    """Give a freshly loaded `adapter` its queue, worker, backlog and prepare stage: it serves.

    `budget.rate`, timed at load, seeds the queue's measured rate, so admission plans by deadline
    from the first request on."""
    tokens, rate = budget.tokens, budget.rate
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
    handle.adapter, handle.queue, handle.worker, handle.budget = adapter, queue, worker, budget
    handle.state = ModelState.LOADED


def memory_device_of(spec: ModelSpec, adapter: Adapter) -> str:
    # The fake model holds host memory whatever device it is given; a static model computes on numpy.
    host = spec.kind == Kind.FAKE or adapter.backend == STATIC_ENGINE
    return "cpu" if host else devices.memory_device(spec.device)


def batch_tokens(spec: ModelSpec, device: str) -> int:
    """The largest batch a model on `device` (its memory device) runs: its own
    `max_batch_tokens`, the largest budget "auto" tries, or the device's default."""
    return max(budget_candidates(device)) if measured(spec) else fixed_budget(spec, device).tokens


def default_batch_tokens(device: str) -> int:
    """The batch budget of a model on `device` that sets none."""
    return _GPU_BATCH_TOKENS if device.startswith("cuda") else _CPU_BATCH_TOKENS


def budget_candidates(device: str) -> tuple[int, ...]:
    """The budgets `max_batch_tokens: auto` times: around the CPU default (whose best depends on
    the engine and the cores), at and below the GPU default (whose memory the load measures)."""
    default = default_batch_tokens(device)
    if device.startswith("cuda"):
        return (default // 8, default // 4, default // 2, default)
    return (default // 2, default, default * 2, default * 4)


def fixed_budget(spec: ModelSpec, device: str, rate: Rate | None = None) -> Budget:
    """The budget of a model that is not measured: its configured number, else the device's default."""
    if isinstance(spec.max_batch_tokens, int):
        return Budget(spec.max_batch_tokens, "configured", rate)
    return Budget(default_batch_tokens(device), "device default", rate)


def measured(spec: ModelSpec) -> bool:
    """Whether the model's budget is chosen by timing batches at each load."""
    return spec.max_batch_tokens == "auto" and spec.kind != Kind.FAKE


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
