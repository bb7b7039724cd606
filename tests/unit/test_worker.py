"""The per-model worker, driven step by step: a gated adapter holds each batch in `collate` or
`forward` until the test lets it go, so each test states exactly which thread holds which batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from model_registry.errors import BatchFailed, ModelUnavailable
from model_registry.runtime import worker as worker_module
from model_registry.runtime.batching import Request
from model_registry.runtime.worker import BatchStats, Worker
from model_registry.types import Score
from tests.builders.gated import WAIT, Call, GatedAdapter, Outcomes, WatchedQueue
from tests.waiting import eventually

#: How long a test watches for something that must not happen: several of the worker's 50 ms polls.
QUIET = 0.2


class Bench:
    """A started worker over a gated adapter; each request holds items of cost 10 and the budget is
    10, so each request is a batch of its own unless a test says otherwise."""

    def __init__(self, max_batch_tokens: int = 10, name: str = "gated") -> None:
        self.adapter = GatedAdapter()
        self.queue = WatchedQueue(max_batch_tokens=max_batch_tokens, max_items=100, batch_cost=lambda n, m, t: n * m)
        self.stats: list[BatchStats] = []
        self.worker = Worker(name, self.adapter, self.queue, on_batch=self.stats.append)
        self.outcomes = Outcomes()
        self.collate = self.adapter.collate_gate
        self.forward = self.adapter.forward_gate

    def put(self, *values: float, priority: int = 0) -> Request:
        request = self.outcomes.request(*values, priority=priority)
        self.queue.put(request)
        return request

    def hold_in_forward(self, *values: float) -> Request:
        """Queue a request on an idle worker and let it through `collate` into `forward`."""
        request = self.put(*values)
        assert self.collate.entered().values == values
        self.collate.release()
        assert self.forward.entered().values == values
        return request

    def prefetch(self, *values: float) -> Request:
        """Queue a request while a batch is in forward: the collator collates it and hands it over."""
        request = self.put(*values)
        assert self.collate.entered() == Call("gated-collate", values)
        self.collate.release()
        self.queue.woken_by("gated-collate")
        return request


@pytest.fixture
def bench() -> Iterator[Bench]:
    bench = Bench()
    bench.worker.start()
    yield bench
    bench.adapter.open()
    bench.worker.stop(timeout=WAIT)
    assert not bench.worker.alive


def results(request: Request) -> list[Score | None]:
    assert request.error is None, request.error
    return [r if isinstance(r, Score) else None for r in request.results]


def test_an_idle_worker_collates_and_runs_a_request_on_its_forward_thread_alone(bench: Bench) -> None:
    request = bench.put(1.0)
    assert bench.collate.entered() == Call("gated-forward", (1.0,))  # the collator is not woken
    bench.collate.release()
    assert bench.forward.entered().values == (1.0,)
    bench.forward.release()
    assert bench.outcomes.next() is request
    assert results(request) == [Score(1.0)]


def test_while_one_batch_runs_exactly_one_more_is_collated_ahead(bench: Bench) -> None:
    first = bench.hold_in_forward(1.0)
    second = bench.prefetch(2.0)
    third = bench.put(3.0)
    # Batch 1 is in forward, batch 2 collated and waiting: batch 3 stays queued.
    assert bench.collate.quiet(QUIET)
    assert bench.queue.depth == 1
    assert bench.outcomes.quiet(0)

    bench.forward.release()
    assert bench.outcomes.next() is first
    # The prefetched batch goes straight into forward, not through collate again; the collator
    # takes batch 3 meanwhile.
    assert bench.forward.entered().values == (2.0,)
    assert bench.collate.entered() == Call("gated-collate", (3.0,))
    bench.collate.release()
    bench.queue.woken_by("gated-collate")
    bench.forward.release()
    assert bench.outcomes.next() is second
    assert bench.forward.entered().values == (3.0,)
    bench.forward.release()
    assert bench.outcomes.next() is third
    assert [results(r) for r in (first, second, third)] == [[Score(1.0)], [Score(2.0)], [Score(3.0)]]


def test_a_cancelled_request_is_dropped_before_its_batch_is_built(bench: Bench) -> None:
    bench.hold_in_forward(1.0)
    bench.prefetch(2.0)
    gone, kept = bench.put(3.0), bench.put(4.0)
    gone.cancel()
    bench.forward.release()
    bench.outcomes.next()
    assert bench.forward.entered().values == (2.0,)
    assert bench.collate.entered().values == (4.0,)  # 3.0 never reaches the model
    assert bench.queue.depth == 0
    bench.adapter.open()
    assert bench.outcomes.next().prepared[0].data == 2.0
    assert bench.outcomes.next() is kept
    assert not gone.finished
    assert gone.results == [None]


def test_a_prefetched_batch_whose_request_was_cancelled_is_not_run(bench: Bench) -> None:
    bench.hold_in_forward(1.0)
    gone = bench.prefetch(2.0)
    gone.cancel()
    bench.forward.release()
    bench.outcomes.next()
    later = bench.put(3.0)
    assert bench.collate.entered().values == (3.0,)
    bench.collate.release()
    assert bench.forward.entered().values == (3.0,)  # not 2.0
    bench.forward.release()
    assert bench.outcomes.next() is later
    assert not gone.finished


class _Clock:
    """The `time` module as the worker sees it, with a `perf_counter` the test moves forward."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.ahead

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_an_idle_spell_after_the_waiting_work_was_cancelled_is_not_counted_as_serving(
    monkeypatch: pytest.MonkeyPatch, bench: Bench
) -> None:
    """A batch ended with work waiting, which was then cancelled: the next batch, a second later,
    is timed by its own stages, not from the end of the one before the idle second."""
    clock = _Clock()
    monkeypatch.setattr(worker_module, "time", clock)
    recorded: list[float] = []
    record = bench.queue.record

    def recording(cost: int, seconds: float) -> None:
        recorded.append(seconds)
        record(cost, seconds)

    idle_polls: list[float] = []
    take = bench.queue.next_batch

    def watched(timeout: float | None = None, **options: Any) -> Any:
        batch = take(timeout, **options)
        if batch is None:
            idle_polls.append(timeout or 0.0)
        return batch

    monkeypatch.setattr(bench.queue, "record", recording)
    monkeypatch.setattr(bench.queue, "next_batch", watched)
    bench.hold_in_forward(1.0)
    bench.prefetch(2.0).cancel()
    bench.forward.release()
    bench.outcomes.next()
    clock.ahead += 1.0  # an idle second on the worker's clock, and one idle poll of the queue
    polls = len(idle_polls)
    eventually(lambda: len(idle_polls), lambda count: count > polls)
    bench.hold_in_forward(3.0)
    bench.forward.release()
    bench.outcomes.next()
    eventually(lambda: len(recorded), lambda count: count >= 2)  # recorded just after the delivery
    assert len(recorded) == 2
    assert recorded[1] < 0.5, recorded


def test_a_prefetched_batch_goes_back_when_higher_priority_work_arrives(bench: Bench) -> None:
    bench.hold_in_forward(1.0)
    bulk = bench.prefetch(2.0)
    urgent = bench.put(3.0, priority=1)
    bench.forward.release()
    bench.outcomes.next()
    # The prefetched bulk batch returns to the queue; the urgent one is collated and runs first.
    assert bench.collate.entered().values == (3.0,)
    bench.collate.release()
    assert bench.forward.entered().values == (3.0,)
    bench.adapter.open()
    assert bench.outcomes.next() is urgent
    assert bench.outcomes.next() is bulk
    assert results(bulk) == [Score(2.0)]


def test_a_failed_forward_fails_exactly_the_requests_of_its_batch_and_the_worker_goes_on() -> None:
    bench = Bench(max_batch_tokens=20)
    both = [bench.put(1.0), bench.put(2.0)]  # queued before the start: one batch of two
    bench.collate.open()
    bench.worker.start()
    try:
        assert bench.forward.entered().values == (1.0, 2.0)
        after = bench.put(3.0)
        bench.forward.fail(RuntimeError("out of memory"))
        failed = {bench.outcomes.next(), bench.outcomes.next()}
        assert failed == set(both)
        assert all(isinstance(r.error, BatchFailed) and "out of memory" in str(r.error) for r in both)
        assert bench.forward.entered().values == (3.0,)
        bench.forward.release()
        assert bench.outcomes.next() is after
        assert results(after) == [Score(3.0)]
    finally:
        bench.adapter.open()
        bench.worker.stop(timeout=WAIT)
    assert [s.failed for s in bench.stats] == [True, False]  # reported after delivery: read once stopped


def test_a_score_of_nan_or_infinity_fails_its_request_alone() -> None:
    bench = Bench(max_batch_tokens=30)
    nan, fine, inf = bench.put(float("nan")), bench.put(2.0), bench.put(float("-inf"))  # one batch
    bench.adapter.open()
    bench.worker.start()
    try:
        assert {bench.outcomes.next() for _ in range(3)} == {nan, fine, inf}
    finally:
        bench.worker.stop(timeout=WAIT)
    assert results(fine) == [Score(2.0)]
    for failed in (nan, inf):
        assert isinstance(failed.error, BatchFailed)
        assert "scored input 0 as NaN or infinity" in str(failed.error)


def test_a_failed_collate_fails_exactly_the_requests_of_its_batch(bench: Bench) -> None:
    bench.hold_in_forward(1.0)
    doomed = bench.put(2.0)
    assert bench.collate.entered().values == (2.0,)
    bench.collate.fail(ValueError("ragged batch"))
    assert bench.outcomes.next() is doomed
    assert isinstance(doomed.error, BatchFailed)
    bench.forward.release()
    assert results(bench.outcomes.next()) == [Score(1.0)]
    later = bench.put(3.0)
    bench.adapter.open()
    assert bench.outcomes.next() is later


def test_stop_fails_queued_and_prefetched_requests_and_lets_the_running_batch_finish(bench: Bench) -> None:
    running = bench.hold_in_forward(1.0)
    prefetched = bench.prefetch(2.0)
    queued = bench.put(3.0)
    stopped = threading.Event()

    def stop() -> None:
        bench.worker.stop(timeout=WAIT)
        stopped.set()

    threading.Thread(target=stop, daemon=True).start()
    assert bench.outcomes.next() is queued  # at once, while batch 1 still runs
    assert isinstance(queued.error, ModelUnavailable)
    bench.forward.release()
    assert bench.outcomes.next() is running
    assert results(running) == [Score(1.0)]
    assert bench.outcomes.next() is prefetched
    assert isinstance(prefetched.error, ModelUnavailable)
    assert stopped.wait(WAIT)
    assert not bench.worker.alive


def test_work_arriving_ends_the_pause_after_a_delivery_at_once(monkeypatch: pytest.MonkeyPatch, bench: Bench) -> None:
    # A pause as long as a test's timeout: only the arriving work can end it in time.
    monkeypatch.setattr("model_registry.runtime.worker._YIELD", 10 * WAIT)
    bench.collate.open()
    bench.hold_in_forward(1.0)
    bench.forward.release()
    bench.outcomes.next()
    later = bench.put(2.0)
    # Taken by the pausing forward thread itself: the collator is not woken for it.
    assert bench.collate.entered() == Call("gated-forward", (2.0,))
    assert bench.forward.entered().values == (2.0,)
    bench.forward.release()
    assert bench.outcomes.next() is later


def test_stop_ends_a_paused_forward_thread_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("model_registry.runtime.worker._YIELD", 10 * WAIT)
    bench = Bench(name="paused")
    bench.adapter.open()
    bench.worker.start()
    bench.put(1.0)
    bench.outcomes.next()  # delivered; the forward thread now pauses before its bookkeeping
    bench.worker.stop(timeout=WAIT)
    assert [t.name for t in threading.enumerate() if t.name.startswith("paused-")] == []
    assert [s.items for s in bench.stats] == [1]  # the bookkeeping still ran


FORWARD = 0.04


class _SlowForward(GatedAdapter):
    """A forward pass of `FORWARD` seconds, everything else free."""

    def forward(self, batch: Any) -> tuple[float, ...]:
        time.sleep(FORWARD)
        return tuple(batch)


def test_admission_rate_counts_the_host_time_between_busy_batches() -> None:
    """While work waits, a batch's share of the time is the span since the previous one ended: here
    each batch's bookkeeping holds the forward thread as long as its forward pass (as a busy event
    loop holding the interpreter lock would), so the model serves half the rate of its passes."""
    adapter = _SlowForward()
    adapter.open()
    batches = WatchedQueue(max_batch_tokens=10, max_items=100, batch_cost=lambda n, m, t: n * m)
    ends: list[float] = []

    def bookkeeping(stats: BatchStats) -> None:
        ends.append(time.perf_counter())
        time.sleep(FORWARD)

    worker = Worker("busy", adapter, batches, on_batch=bookkeeping)
    outcomes = Outcomes()
    requests = [outcomes.request(float(i)) for i in range(24)]
    for request in requests:
        batches.put(request)
    worker.start()
    try:
        for _ in requests:
            outcomes.next()
    finally:
        worker.stop(timeout=WAIT)
    # Units per second from batch end to batch end over the last half, which the smoothed rate
    # mostly reflects (the first batches also pay the threads' one-time set-up).
    served = 10 * 11 / (ends[-1] - ends[-12])
    # Counting the passes alone would give twice `served` (10 units per 40 ms, against per 80 ms).
    assert 0.75 * served < batches.rate < 1.3 * served, (batches.rate, served)
