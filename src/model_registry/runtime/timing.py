"""Where a request's time went: prepare, queue wait, forward and postprocess, per model.

The engine records plain timestamps; whoever runs a request reads them without any tracing
library in the engine:

    with recording() as stages:
        await registry.embed("model", ["text"])
    stages[0].queue_seconds

Every `Registry.run` finished inside `recording()` (in this task or a task it started) appends
one `StageTimes`. Timestamps are wall-clock seconds (`time.time()`), so they can be placed on
a trace's timeline as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """One batch a request's items ran in: when its forward pass ran and when postprocess ended."""

    forward_start: float
    forward_end: float
    postprocess_end: float
    items: int  # items in the whole batch, of every request in it
    cost: int  # the batch's cost, padding counted
    tokens: int  # real tokens in the batch
    capacity: int  # the model's max_batch_tokens


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One `Registry.run`: from the start of prepare to the delivery of its last result."""

    model: str
    items: int
    tokens: int
    prepare_start: float
    enqueued: float  # prepare ended and the items entered the model's queue
    finished: float
    batches: tuple[BatchTimes, ...]

    @property
    def prepare_seconds(self) -> float:
        return self.enqueued - self.prepare_start

    @property
    def queue_seconds(self) -> float:
        """From entering the queue to the first forward pass that held one of its items."""
        if not self.batches:
            return self.finished - self.enqueued
        return max(0.0, min(b.forward_start for b in self.batches) - self.enqueued)

    @property
    def forward_seconds(self) -> float:
        return sum(b.forward_end - b.forward_start for b in self.batches)

    @property
    def postprocess_seconds(self) -> float:
        return sum(b.postprocess_end - b.forward_end for b in self.batches)


_stages: ContextVar[list[StageTimes] | None] = ContextVar("model_registry_stages", default=None)


@contextmanager
def recording() -> Iterator[list[StageTimes]]:
    """Collect the `StageTimes` of every run finished inside the block (tasks started in it too)."""
    collected: list[StageTimes] = []
    token = _stages.set(collected)
    try:
        yield collected
    finally:
        _stages.reset(token)


def report(times: StageTimes) -> None:
    """Called by the registry when a run finishes; a no-op outside `recording()`."""
    collected = _stages.get()
    if collected is not None:
        collected.append(times)
