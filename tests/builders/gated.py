"""A fake adapter whose `collate` and `forward` stop at gates the test opens, one call at a time.

Each gated call reports itself (the thread that made it and the batch's values) and then waits
for the test's word, so a test can hold a batch in `forward`, look at what the worker did
meanwhile, and let it go on. Every wait has a timeout: a test that forgets a step fails instead of
hanging.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.runtime.batching import BatchQueue, Request
from model_registry.types import Capability, Item, Kind, Prepared, Result, Score

#: The longest any step waits for the other side, in seconds: long enough for a loaded machine,
#: short enough that a test waiting for something that never comes fails quickly.
WAIT = 5.0


@dataclass(frozen=True, slots=True)
class Call:
    """One call that reached a gate: on which thread, with which items' values."""

    thread: str
    values: tuple[float, ...]


class Gate:
    """One stage of the adapter. A call reports itself on `entered`, then waits for `release`
    (go on), `fail` (raise) or `open` (let this and every later call through)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entered: queue.Queue[Call] = queue.Queue()
        self._verdicts: queue.Queue[Exception | None] = queue.Queue()
        self._open = threading.Event()

    def __call__(self, values: tuple[float, ...]) -> None:
        self._entered.put(Call(threading.current_thread().name, values))
        if self._open.is_set():
            return
        try:
            verdict = self._verdicts.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"the test never released {self.name}{values}") from None
        if verdict is not None:
            raise verdict

    def entered(self) -> Call:
        """The next call to reach this gate, waiting for it."""
        try:
            return self._entered.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"nothing reached {self.name} within {WAIT}s") from None

    def quiet(self, seconds: float) -> bool:
        """True when no call reaches this gate within `seconds` (for what must not happen)."""
        try:
            call = self._entered.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"{self.name} was entered unexpectedly: {call}")

    def release(self) -> None:
        self._verdicts.put(None)

    def fail(self, error: Exception) -> None:
        self._verdicts.put(error)

    def open(self) -> None:
        """Let every call through from now on, including one waiting now."""
        self._open.set()
        for _ in range(2):  # at most two calls wait at once: the collator's and the forward thread's
            self._verdicts.put(None)


class GatedAdapter(Adapter):
    """Items are floats; each item's result is `Score(value)`. `collate` and `forward` are gated;
    `collate_gate.open()` makes collating free for tests that only step through `forward`."""

    kind = Kind.FAKE
    capabilities = frozenset({Capability.EMBED_TEXT})
    backend = "fake"

    def __init__(self) -> None:
        self.collate_gate = Gate("collate")
        self.forward_gate = Gate("forward")

    def load(self, options: LoadOptions) -> None:
        return None

    def unload(self) -> None:
        return None

    def footprint(self) -> int:
        return 0

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        raise AssertionError("the worker never prepares: tests build Prepared items themselves")

    def collate(self, items: Sequence[Prepared]) -> tuple[float, ...]:
        values = tuple(float(p.data) for p in items)
        self.collate_gate(values)
        return values

    def forward(self, batch: Any) -> tuple[float, ...]:
        self.forward_gate(batch)
        return tuple(batch)

    def postprocess(self, batch: Any, output: Any) -> list[Result]:
        return [Score(value) for value in output]

    def open(self) -> None:
        """Let everything through: for a test's teardown, so no worker thread stays held."""
        self.collate_gate.open()
        self.forward_gate.open()


class Outcomes:
    """Finished requests, in the order they finished, from whichever thread finished them."""

    def __init__(self) -> None:
        self._done: queue.Queue[Request] = queue.Queue()

    def request(self, *values: float, cost: int = 10, priority: int = 0, deadline: float = 1e18) -> Request:
        """A request of one item per value, each costing `cost`, reporting here when finished."""
        prepared = [Prepared(i, cost, cost, value) for i, value in enumerate(values)]
        return Request(prepared, priority=priority, deadline=deadline, on_done=self._done.put)

    def next(self) -> Request:
        """The next request to finish, waiting for it."""
        try:
            return self._done.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no request finished within {WAIT}s") from None

    def quiet(self, seconds: float) -> bool:
        """True when no request finishes within `seconds`."""
        try:
            request = self._done.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"a request finished unexpectedly: {request.prepared}")


class WatchedQueue(BatchQueue):
    """A `BatchQueue` that reports which thread calls `wake`. The worker's collator calls it right
    after handing a prefetched batch over, so a wake from that thread says the handoff is done."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._wakes: queue.Queue[str] = queue.Queue()

    def wake(self) -> None:
        self._wakes.put(threading.current_thread().name)
        super().wake()

    def woken_by(self, thread: str) -> None:
        """Wait for a wake from `thread`, skipping other threads' wakes."""
        try:
            while self._wakes.get(timeout=WAIT) != thread:
                pass
        except queue.Empty:
            raise AssertionError(f"{thread} did not wake the queue within {WAIT}s") from None
