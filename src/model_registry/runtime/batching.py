"""The per-model queue: requests in, cost-packed batches out.

One owner per queue and a tiny API: `put` (from the event loop), `next_batch` / `requeue` /
`outranks` / `record` (from the model's worker threads). Thread-safe.

How a batch is chosen, each time the worker asks for one:
1. Items of cancelled or expired requests are dropped (expired requests fail with
   `DeadlineExceeded`), so no compute is spent on a client that has gone.
2. The *head request* is chosen. Normally it is the request of the highest priority class that has
   been served the least cost so far (fair sharing: a request joins its class at the service level
   of the least-served one waiting, so neither an old bulk request nor a new one can starve the
   other). Aging: when a request of a lower class has waited `aging` seconds without progress and
   no aged batch was given in the last `aging` seconds nor as the previous batch, that request
   (the one waiting longest) is the head instead. So every request progresses by at least one
   batch per max(`aging`, two batch times) per request ahead of it, and a higher class loses at
   most one batch in `aging` seconds, and never two in a row, to aging.
3. A window of the head's class and group (up to `window` batches' worth of cost and at most
   `WINDOW_ITEMS` items, the head request first, then the others by service level) is sorted by
   cost and cut into batches that fit `max_batch_tokens` as the adapter's `batch_cost` counts them
   (padding included, except on an engine that runs padding-free); the batch holding
   the head's oldest item is returned. A wide window pads less, nearly as little as one sort over
   the whole backlog (figures: docs/reliability.md).

A small request (at most `small_request_items` items) ranks above bulk ones by default, and
batches never mix priority classes: a single search query waits for the batch in flight, then runs
in a batch of its own kind instead of behind a bulk backlog. The policy and its worst-case bounds
are written out in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

from model_registry.errors import DeadlineExceeded, ModelUnavailable, Overloaded
from model_registry.runtime.timing import BatchTimes
from model_registry.types import Prepared, Result

_sequence = count()

#: The most items one batch's sort window holds, whatever the budget: bounds the collating
#: thread's sorting per batch (a few milliseconds of Python) for models with large budgets.
WINDOW_ITEMS = 4096


@dataclass(eq=False)
class Request:
    """One caller's call: its prepared items and where their results go.

    `on_done` is called exactly once, from whichever thread finishes the request, with the request
    itself; `error` is set when it failed. A caller on an event loop builds it with `on_loop` and
    awaits `outcome()`: the request itself carries the bridge from the worker's thread to the loop.
    """

    prepared: Sequence[Prepared]
    priority: int
    deadline: float
    on_done: Callable[[Request], None]
    seq: int = field(default_factory=lambda: next(_sequence))
    results: list[Result | None] = field(init=False)
    error: Exception | None = None
    remaining: int = field(init=False)
    cancelled: bool = False
    # Each batch that ran some of its items, appended by the worker before it delivers them.
    batches: list[BatchTimes] = field(default_factory=list)
    #: Cost taken into batches so far, counted from the service level it joined its class at.
    served: int = 0
    #: When it last got items into a batch (or was queued): its wait, for aging.
    progressed_at: float = 0.0
    _finished: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _settled: asyncio.Future[Request] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.prepared)
        self.remaining = len(self.prepared)

    @classmethod
    def on_loop(cls, prepared: Sequence[Prepared], *, priority: int, deadline: float) -> Request:
        """A request completed on the running event loop: await `outcome()` for its results."""
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[Request] = loop.create_future()

        def settle(request: Request) -> None:
            if not settled.done():
                settled.set_result(request)

        def on_done(request: Request) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, request)

        request = cls(prepared, priority=priority, deadline=deadline, on_done=on_done)
        request._settled = settled
        return request

    async def outcome(self, clock: Callable[[], float] = time.monotonic) -> list[Result]:
        """Every item's result, in order; the request's error, or `DeadlineExceeded` at its deadline.

        A caller that stops waiting (deadline or cancellation) cancels the request, so its pending
        items are dropped before they reach the model."""
        settled = self._settled
        assert settled is not None, "This is a bug: outcome() needs a request built by on_loop()"
        limit = self.deadline - clock()

        def expire() -> None:
            if not settled.done():
                settled.set_exception(
                    DeadlineExceeded(
                        f"the request did not finish within its deadline, {limit:.3g}s after it was queued"
                    )
                )

        # The future itself, with a timer, rather than `wait_for(shield(...))`: its result resumes
        # this task in the next turn of the loop, not three turns later (each turn of an idle
        # loop is tens of microseconds of an idle request's latency). Cancelling this task
        # cancels the future; a result delivered after that finds it done and is dropped.
        timer = asyncio.get_running_loop().call_later(max(0.0, limit), expire)
        try:
            await settled
        except (DeadlineExceeded, asyncio.CancelledError):
            self.cancel()
            raise
        finally:
            timer.cancel()
        if self.error is not None:
            raise self.error
        return [r for r in self.results if r is not None]

    @property
    def finished(self) -> bool:
        return self._finished

    def deliver(self, index: int, result: Result) -> None:
        with self._lock:
            if self._finished:
                return
            self.results[index] = result
            self.remaining -= 1
            done = self.remaining == 0
            self._finished = done
        if done:
            self.on_done(self)

    def fail(self, error: Exception) -> None:
        with self._lock:
            if self._finished:
                return
            self.error = error
            self._finished = True
        self.on_done(self)

    def cancel(self) -> None:
        """Called by the caller's side; pending items are dropped at the next batch."""
        self.cancelled = True


@dataclass(frozen=True, slots=True)
class Entry:
    request: Request
    prepared: Prepared


@dataclass(frozen=True)
class Batch:
    entries: tuple[Entry, ...]
    cost: int
    priority: int
    group: str
    #: Chosen by aging, ahead of higher classes: not given back when they outrank it.
    aged: bool = False

    def live(self) -> bool:
        return all(not e.request.cancelled and not e.request.finished for e in self.entries)


class BatchQueue:
    def __init__(
        self,
        *,
        max_batch_tokens: int,
        max_items: int,
        batch_cost: Callable[[int, int, int], int],
        small_request_items: int = 8,
        window: int = 16,
        aging: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_items = max_items
        self.small_request_items = small_request_items
        self.aging = aging
        self._batch_cost = batch_cost
        self._window = window
        self._clock = clock
        self._pending: dict[Request, deque[Entry]] = {}
        self._count = 0
        self._pending_cost = 0
        self._cond = threading.Condition()
        self._closed = False
        self._last_aged = -math.inf
        self._aged_last = False  # the last batch taken was an aged one
        self._rate = 0.0  # item cost per second, smoothed; for Retry-After and admission
        #: Called (on the putting thread, outside the lock) after every `put` that queued work.
        self.on_put: Callable[[], None] | None = None

    # ---- the event loop's side -----------------------------------------------------------------

    def priority_for(self, n_items: int, requested: int | None) -> int:
        """The class of a request: `requested` if given (already allowed by `client_priority`),
        else 1 for a small request and 0 for bulk."""
        if requested is not None:
            return requested
        return 1 if n_items <= self.small_request_items else 0

    def put(self, request: Request) -> None:
        """Enqueue every item of `request`, or none: a full queue raises `Overloaded`."""
        entries = deque(Entry(request, p) for p in request.prepared)
        with self._cond:
            if self._closed:
                raise ModelUnavailable("the model is being unloaded; retry the request")
            if self._count + len(entries) > self.max_items:
                raise Overloaded(
                    f"the model's queue is full ({self._count} items waiting, limit {self.max_items})",
                    retry_after=self._retry_after(),
                )
            if entries:
                peers = [r.served for r in self._pending if r.priority == request.priority]
                request.served = min(peers, default=0)
                request.progressed_at = self._clock()
                self._pending[request] = entries
                self._count += len(entries)
                self._pending_cost += sum(e.prepared.cost for e in entries)
                self._cond.notify_all()
        if entries and self.on_put is not None:
            self.on_put()

    @property
    def depth(self) -> int:
        """Items waiting (not yet taken into a batch)."""
        return self._count

    @property
    def pending_cost(self) -> int:
        """The summed cost (tokens, for text models) of the items waiting."""
        return self._pending_cost

    @property
    def rate(self) -> float:
        """Measured item cost per second of forward time (0 before the first batch)."""
        return self._rate

    def close(self) -> list[Request]:
        """Stop accepting work; returns the requests that still had items waiting."""
        with self._cond:
            self._closed = True
            waiting = list(self._pending)
            self._pending.clear()
            self._count = self._pending_cost = 0
            self._cond.notify_all()
        return waiting

    # ---- the worker's side ---------------------------------------------------------------------

    def next_batch(self, timeout: float | None = None, *, until: Callable[[], bool] | None = None) -> Batch | None:
        """The next batch, waiting up to `timeout` seconds for work; None on timeout or close, or
        as soon as `until()` is true when it is checked (at the start, and after each `wake`)."""
        deadline = None if timeout is None else self._clock() + timeout
        batch: Batch | None = None
        with self._cond:
            while True:
                if self._closed or (until is not None and until()):
                    return None
                expired = self._purge()
                if self._pending:
                    batch = self._take()
                    break
                remaining = None if deadline is None else deadline - self._clock()
                if remaining is not None and remaining <= 0:
                    batch = None
                    break
                self._cond.wait(remaining)
        for request in expired:
            request.fail(DeadlineExceeded("the request's deadline passed while it waited in the queue"))
        return batch

    def wake(self) -> None:
        """Wake every thread waiting in `next_batch`, to check its `until` again."""
        with self._cond:
            self._cond.notify_all()

    def requeue(self, entries: Sequence[Entry]) -> None:
        """Put taken entries back at the front of their requests (order kept). After `close`,
        their requests fail at once: nobody would ever take them again."""
        with self._cond:
            if self._closed:
                gone = {e.request for e in entries}
            else:
                gone = set()
                for entry in reversed(entries):
                    if entry.request.cancelled or entry.request.finished:
                        continue
                    self._pending.setdefault(entry.request, deque()).appendleft(entry)
                    self._count += 1
                    self._pending_cost += entry.prepared.cost
                    entry.request.served -= entry.prepared.cost
                # Keep arrival order among requests after re-inserting.
                self._pending = dict(sorted(self._pending.items(), key=lambda kv: kv[0].seq))
                self._cond.notify_all()
        for request in gone:
            request.fail(ModelUnavailable("the model was unloaded before this request ran"))

    def outranks(self, batch: Batch) -> bool:
        """Whether live work of a higher priority than `batch` is waiting (an aged batch keeps
        its turn: giving it back would undo the aging)."""
        if batch.aged:
            return False
        with self._cond:
            return any(r.priority > batch.priority and not r.cancelled for r in self._pending)

    def record(self, cost: int, seconds: float) -> None:
        """Feed the throughput estimate behind admission and Retry-After (item cost, no padding)."""
        if seconds > 0:
            rate = cost / seconds
            self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate

    # ---- internals (lock held) -----------------------------------------------------------------

    def _retry_after(self) -> float:
        if self._rate <= 0:
            return 1.0
        return float(max(1, math.ceil(self._pending_cost / self._rate)))

    def _drop(self, request: Request) -> None:
        entries = self._pending.pop(request)
        self._count -= len(entries)
        self._pending_cost -= sum(e.prepared.cost for e in entries)

    def _purge(self) -> list[Request]:
        now, expired = self._clock(), []
        for request in list(self._pending):
            if request.cancelled or request.finished:
                self._drop(request)
            elif request.deadline <= now:
                self._drop(request)
                expired.append(request)
        return expired

    def _head(self) -> tuple[Request, bool]:
        """The request the next batch serves, and whether aging chose it (see the module doc)."""
        now = self._clock()
        top = max(r.priority for r in self._pending)
        # Never two aged batches in a row: with batches slower than `aging`, the higher class
        # still gets every other batch.
        if not self._aged_last and now - self._last_aged >= self.aging:
            starving = [r for r in self._pending if r.priority < top and now - r.progressed_at >= self.aging]
            if starving:
                self._last_aged, self._aged_last = now, True
                return min(starving, key=lambda r: (r.progressed_at, r.seq)), True
        self._aged_last = False
        return min((r for r in self._pending if r.priority == top), key=lambda r: (r.served, r.seq)), False

    def _take(self) -> Batch:
        first, aged = self._head()
        head = self._pending[first][0]
        priority, group = first.priority, head.prepared.group
        peers = sorted(
            (r for r in self._pending if r.priority == priority and r is not first), key=lambda r: (r.served, r.seq)
        )
        window: list[Entry] = []
        budget = self._window * self.max_batch_tokens
        for request in (first, *peers):
            if budget <= 0 or len(window) >= WINDOW_ITEMS:
                break
            for entry in self._pending[request]:
                if len(window) >= WINDOW_ITEMS:
                    break
                if entry.prepared.group == group:
                    window.append(entry)
                    budget -= entry.prepared.cost
        window.sort(key=lambda e: e.prepared.cost)
        chosen = self._cut(window, head)
        self._remove(chosen)
        costs = [e.prepared.cost for e in chosen]
        return Batch(tuple(chosen), self._batch_cost(len(costs), max(costs), sum(costs)), priority, group, aged)

    def _remove(self, chosen: list[Entry]) -> None:
        taken, now = set(map(id, chosen)), self._clock()
        for request in {e.request for e in chosen}:
            kept = deque(e for e in self._pending[request] if id(e) not in taken)
            self._count -= len(self._pending[request]) - len(kept)
            request.served += sum(e.prepared.cost for e in self._pending[request] if id(e) in taken)
            request.progressed_at = now
            if kept:
                self._pending[request] = kept
            else:
                del self._pending[request]
        self._pending_cost -= sum(e.prepared.cost for e in chosen)

    def _cut(self, window: list[Entry], head: Entry) -> list[Entry]:
        """Cut the cost-sorted window into budget-sized runs; return the run holding `head`."""
        run: list[Entry] = []
        longest = total = 0
        holds_head = False
        for entry in window:
            cost = entry.prepared.cost
            if run and self._batch_cost(len(run) + 1, max(longest, cost), total + cost) > self.max_batch_tokens:
                if holds_head:
                    return run
                run, longest, total = [], 0, 0
            run.append(entry)
            longest, total = max(longest, cost), total + cost
            holds_head = holds_head or entry is head
        return run
