"""The per-model worker: collate -> forward -> postprocess, on two supervised threads.

While the forward thread runs a batch and more work is queued, the collator thread takes the next
batch from the queue and collates it, so exactly one batch is prepared ahead; with nothing queued
it stays asleep, off the cores the engine's threads are using. An idle forward thread takes and
collates the next batch itself: an idle model's request wakes one thread, not two in turn (each
wake of a sleeping thread costs a fraction of a millisecond, more on a virtual machine). Having
delivered with nothing else queued, the forward thread pauses (at most `_YIELD`) before its
bookkeeping, so that the event loop it woke answers without waiting for the interpreter lock. Before
running a prefetched batch the forward thread checks it is still the right one: if a request of a
higher priority arrived meanwhile, or some of its requests were cancelled, the live entries go
back to the queue and a fresh batch is taken. A failure in any stage fails exactly the requests of
that batch with `BatchFailed`; the threads keep serving. A torch model on the CPU hands its forward
pass and postprocess to the CPU's one torch thread (`devices.torch_thread`) and waits for them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.backends import devices
from model_registry.errors import (
    BatchFailed,
    Cancelled,
    DeadlineExceeded,
    ModelUnavailable,
    RegistryError,
    not_finite,
)
from model_registry.runtime.batching import Batch, BatchQueue, Entry, Request
from model_registry.runtime.timing import BatchTimes
from model_registry.types import EmbedItem, Item, Labels, Media, Mixed, Prepared, Result, Score

log = logging.getLogger(__name__)

_POLL = 0.05
#: The longest an idle forward thread waits after delivering before its bookkeeping: about the
#: event loop's own path from waking to writing the response, after an idle spell.
_YIELD = 0.001

#: A text request whose texts hold at most this many tokens, estimated from their characters
#: before any cut, is tokenized on the event loop itself: the hop to a prepare thread and back
#: costs more than its tokenizing (a few hundred microseconds at most), and it is the whole of an
#: idle query's wait before its forward pass. A truncating text counts whole: the tokenizer reads
#: all of it before cutting, so a long one goes to the prepare threads even if cut short.
INLINE_COST = 256

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchStats:
    model: str
    items: int
    cost: int
    tokens: int
    seconds: float
    failed: bool
    capacity: int = 0  # the queue's max_batch_tokens: cost / capacity is how full the batch was


class PrepareStage:
    """The model's own prepare threads (tokenizing, decoding), bounded and inside the deadline.

    Each model has its own, so one model's slow decoding never delays another model's requests.
    Work whose caller stopped waiting is skipped when its turn comes instead of run for nobody.
    """

    def __init__(self, name: str, adapter: Adapter, threads: int) -> None:
        self._adapter = adapter
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"{name}-prepare", initializer=side_thread)

    async def run(self, items: Sequence[Item], seconds: float, *, reads: int | None = None) -> list[Prepared]:
        """`adapter.prepare(items)` on the model's threads; `DeadlineExceeded` after `seconds`.

        Text-only work that reads at most `INLINE_COST` tokens (`reads`, when given: the
        request's tokens by characters, before any cut) runs on the calling event loop instead:
        bounded, and cheaper than the two thread hops."""
        if reads is not None and reads <= INLINE_COST and not any(_is_media(i) for i in items):
            return self._adapter.prepare(items)
        abandoned = threading.Event()

        def job() -> list[Prepared]:
            if abandoned.is_set():
                raise Cancelled("the caller stopped waiting before its inputs were prepared")
            return self._adapter.prepare(items)

        work = asyncio.get_running_loop().run_in_executor(self._pool, job)
        work.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(work), max(0.0, seconds))
        except asyncio.TimeoutError:
            abandoned.set()
            raise DeadlineExceeded(f"preparing the inputs took longer than the {seconds:.3g}s left") from None
        except asyncio.CancelledError:
            abandoned.set()
            raise

    async def call(self, fn: Callable[[], T]) -> T:
        """`fn` (tokenizer work outside a request's items: tokenize, decode, cutting texts) on the
        same bounded threads, so it cannot take cores from other models either."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def side_thread() -> None:
    """Torch's operators on this thread (a prepare or collate thread) run on it alone.

    Each thread that runs a parallel operator keeps an OpenMP pool of its own; with more pool
    threads than cores, libgomp stops them spinning between operators, and the forward passes of
    every model slow down (1.3x on 2 cores). The pool that computes (`devices.torch_thread`'s on
    a CPU) is the one that needs the cores; resizing an image or stacking a batch does not."""
    if importlib.util.find_spec("torch") is None:  # installed without torch: no pool to confine
        return
    from model_registry.backends.torch import engine as torch_backend

    try:
        torch_backend.confine(1)
    except Exception:  # a setting of the thread, not a reason to stop serving
        log.exception("setting up a prepare or collate thread failed; it runs without that")


def _is_media(item: Item) -> bool:
    return isinstance(item, EmbedItem) and isinstance(item.content, Media | Mixed)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned prepare's error as seen: its caller has its own error already."""
    if not future.cancelled():
        future.exception()


class Worker:
    def __init__(
        self,
        name: str,
        adapter: Adapter,
        batches: BatchQueue,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
    ) -> None:
        self.name = name
        self.adapter = adapter
        self.batches = batches
        self._on_batch = on_batch
        self._handoff: queue.Queue[tuple[Batch, Any, float]] = queue.Queue(maxsize=1)
        self._slot_free = threading.Event()
        self._slot_free.set()
        # Set while the forward thread holds a batch and more work is queued: prefetch the next.
        # Only then: a collator woken at the start of every forward pass would take a core from
        # the engine's threads just as they start (on a small machine, a pass stalled behind it).
        self._running = threading.Event()
        self._forwarding = False
        # Set while the forward thread pauses after delivering (see `_pause`); work arriving sets
        # `_resume` to end the pause.
        self._pausing = False
        self._resume = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.busy = False
        # When the last batch ended with more work waiting: the next batch's share of the time is
        # then the span between the two ends, gaps included (see `_run`).
        self._busy_since: float | None = None
        device = devices.memory_device(adapter.device or "cpu")
        self._gate = devices.gate(device)
        # Every torch model on the CPU computes on one thread: one OpenMP pool in the process.
        self._shared = devices.compute_thread(adapter.backend, device)
        batches.on_put = self._work_arrived

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._collate_thread, name=f"{self.name}-collate"),
            threading.Thread(target=self._forward_thread, name=f"{self.name}-forward"),
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._running.set()  # release the collator's wait
        self._resume.set()  # and a forward thread's pause
        for request in self.batches.close():
            request.fail(ModelUnavailable(f"the model '{self.name}' was unloaded before this request ran"))
        self._slot_free.set()
        for thread in self._threads:
            thread.join(timeout)
        while not self._handoff.empty():
            batch, _, _ = self._handoff.get_nowait()
            self._fail(batch, ModelUnavailable(f"the model '{self.name}' was unloaded before this request ran"))

    @property
    def alive(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    @property
    def idle(self) -> bool:
        return not self.busy and self._handoff.empty() and self.batches.depth == 0

    # ---- threads -------------------------------------------------------------------------------

    def _forward_thread(self) -> None:
        try:
            self.adapter.on_forward_thread()
        except Exception:  # a setting of the thread, not a reason to stop serving
            log.exception("model '%s': setting up its forward thread failed; it runs without that", self.name)
        if self._shared is not None:
            side_thread()  # its torch work runs on the shared thread; what is left here is collating
        self._supervise(self._forward_once)

    def _collate_thread(self) -> None:
        side_thread()
        self._supervise(self._collate_once)

    def _supervise(self, step: Callable[[], None]) -> None:
        """Run `step` until stopped; an exception escaping a step is a bug, logged, and survived."""
        while not self._stop.is_set():
            try:
                step()
            except Exception:  # a step already failed its batch; this is the last line of defence
                log.exception("This is a bug: the worker of model '%s' raised outside a batch", self.name)
                time.sleep(_POLL)

    def _collate_once(self) -> None:
        """Prefetch: while a batch runs, take and collate the next one."""
        if not self._slot_free.wait(_POLL) or not self._running.wait(_POLL):
            return
        batch = self.batches.next_batch(timeout=_POLL, until=lambda: not self._running.is_set())
        if batch is None:
            return
        collated = self._collate(batch)
        if collated is None:
            return
        self._slot_free.clear()
        self._handoff.put(collated)
        self.batches.wake()  # an idle forward thread waits in the queue, not on the handoff

    def _work_arrived(self) -> None:
        """Work was queued: if a forward pass is running, the collator prefetches it; if the forward
        thread pauses after one, it stops pausing. (The queue's count rises before this reads
        `_forwarding` or `_pausing`, which are set before the forward thread reads the count: one
        of the two sees the other.)"""
        if self._forwarding:
            self._running.set()
        elif self._pausing:
            self._resume.set()

    def _collate(self, batch: Batch) -> tuple[Batch, Any, float] | None:
        started = time.perf_counter()
        try:
            collated = self.adapter.collate([e.prepared for e in batch.entries])
        except Exception as error:
            self._fail(batch, error)
            return None
        return batch, collated, time.perf_counter() - started

    def _forward_once(self) -> None:
        prefetched = True
        try:
            taken: tuple[Batch, Any, float] | None = self._handoff.get_nowait()
        except queue.Empty:
            prefetched = False
            batch = self.batches.next_batch(timeout=_POLL, until=lambda: not self._handoff.empty())
            taken = None if batch is None else self._collate(batch)
        if taken is None:
            self._busy_since = None  # the work that waited is gone (cancelled, expired): an idle spell
            return
        batch, collated, collating = taken
        self.busy = True
        self._forwarding = True
        if self.batches.depth:
            self._running.set()
        self._slot_free.set()
        try:
            if prefetched and (not batch.live() or self.batches.outranks(batch)):
                self.batches.requeue(batch.entries)
                return
            self._run(batch, collated, collating)
        finally:
            self._forwarding = False
            self._running.clear()
            self.busy = False
            self.batches.wake()  # a collator waiting for work while this ran stops waiting

    def run_here(self, request: Request) -> bool:
        """Compute `request` on the calling thread and deliver it, as one batch, where the adapter
        `computes_inline`, the request costs at most `INLINE_COST` and one batch holds it, and the
        model is idle (nothing queued, collated or running); else leave it (False) for the queue.

        For a table lookup the two thread hops each way are most of an idle request's time; the
        batch is counted, timed and delivered as the forward thread would."""
        prepared = request.prepared
        if not self.adapter.computes_inline or not prepared or self.busy or self.batches.depth:
            return False
        if not self._handoff.empty() or len({p.group for p in prepared}) > 1:
            return False
        cost = self.adapter.batch_cost(len(prepared), max(p.cost for p in prepared), sum(p.cost for p in prepared))
        if cost > INLINE_COST:
            return False
        entries = tuple(Entry(request, p) for p in prepared)
        batch = Batch(entries, cost, request.priority, prepared[0].group)
        started = time.perf_counter()
        try:
            collated = self.adapter.collate(prepared)
        except Exception as error:
            self._fail(batch, error)
            return True
        self._run(batch, collated, time.perf_counter() - started, pause=False)
        return True

    def _run(self, batch: Batch, collated: Any, collating: float, *, pause: bool = True) -> None:
        started, forward_start = time.perf_counter(), time.time()
        failed = False
        try:
            if self._shared is None:
                results, forward_end = self._compute(collated)
            else:
                results, forward_end = self._shared.call(lambda: self._compute(collated))
            if len(results) != len(batch.entries):
                raise RuntimeError(
                    f"This is a bug: {type(self.adapter).__name__}.postprocess returned {len(results)} "
                    f"results for {len(batch.entries)} items; it must return one per item"
                )
        except Exception as error:
            failed = True
            self._report(batch, time.perf_counter() - started, failed)
            self._fail(batch, error)
        else:
            self._stamp(batch, forward_start, forward_end)
            self._report(batch, time.perf_counter() - started, failed)
            for entry, result in zip(batch.entries, results, strict=True):
                if _finite_scores(result):
                    entry.request.deliver(entry.prepared.index, result)
                else:
                    entry.request.fail(not_finite(f"the model '{self.name}' scored input {entry.prepared.index} as"))
        ended = time.perf_counter()
        # Admission plans with the rate batches are served at: every stage a batch goes through, and
        # while work keeps waiting, the gaps between batches too (waits for the interpreter lock or
        # a shared device), which a busy host stretches.
        spent = collating + ended - started if self._busy_since is None else ended - self._busy_since
        waiting = bool(self.batches.depth) or not self._handoff.empty()
        self._busy_since = ended if waiting else None
        if pause and not failed and not waiting:
            self._pause()
        self.batches.record(sum(e.prepared.cost for e in batch.entries), spent)

    def _report(self, batch: Batch, seconds: float, failed: bool) -> None:
        """Count the batch before any of its requests is answered, so that a client holding its
        answer never reads metrics that miss the batch which made it (a few microseconds)."""
        if self._on_batch is not None:
            tokens = sum(e.prepared.tokens for e in batch.entries)
            capacity = self.batches.max_batch_tokens
            self._on_batch(BatchStats(self.name, len(batch.entries), batch.cost, tokens, seconds, failed, capacity))

    def _compute(self, collated: Any) -> tuple[Sequence[Any], float]:
        """The forward pass and the heads: the results, and when the forward pass ended."""
        with self._gate.shared():  # a load measuring its peak on this device runs alone
            output = self.adapter.forward(collated)
        forward_end = time.time()
        return self.adapter.postprocess(collated, output), forward_end

    def _pause(self) -> None:
        """With nothing else to run, let the event loop answer first: the bookkeeping after a batch
        holds the interpreter lock for a tenth of a millisecond after an idle spell, which the
        loop, just woken by the delivery, would otherwise wait for. Work arriving ends the pause at
        once and is taken by this thread (no prefetch: the collator stays asleep)."""
        self._forwarding = False
        self._pausing = True
        if not self.batches.depth:  # read after `_pausing` is set: see `_work_arrived`
            self._resume.wait(_YIELD)
        self._pausing = False
        self._resume.clear()

    def _stamp(self, batch: Batch, forward_start: float, forward_end: float) -> None:
        """Record the batch's times on each of its requests, before any of them is delivered."""
        tokens = sum(e.prepared.tokens for e in batch.entries)
        capacity = self.batches.max_batch_tokens
        times = BatchTimes(forward_start, forward_end, time.time(), len(batch.entries), batch.cost, tokens, capacity)
        for request in {id(e.request): e.request for e in batch.entries}.values():
            request.batches.append(times)

    def _fail(self, batch: Batch, error: Exception) -> None:
        if not isinstance(error, RegistryError):
            log.error("model '%s' failed a batch of %d items: %r", self.name, len(batch.entries), error)
            error = BatchFailed(f"the model '{self.name}' failed while processing this request: {error}")
        for request in {e.request for e in batch.entries}:
            request.fail(error)


def _finite_scores(result: Result) -> bool:
    """False for a score or label logits holding NaN or infinity, which a sort or JSON would turn
    into a silent wrong answer. Vectors are checked where they are encoded, as one array each."""
    if isinstance(result, Score):
        return math.isfinite(result.value)
    if isinstance(result, Labels):
        return bool(np.isfinite(result.logits).all())
    return True
