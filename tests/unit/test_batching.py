"""The per-model queue: cost packing, length sorting, priorities, cancellation, deadlines, bounds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

import pytest

from model_registry.errors import DeadlineExceeded, ModelUnavailable, Overloaded
from model_registry.runtime.batching import Batch, BatchQueue, Request
from model_registry.types import Prepared


def padded(count: int, longest: int, total: int) -> int:
    return count * longest


def make_queue(**kwargs: Any) -> BatchQueue:
    options: dict[str, Any] = {"max_batch_tokens": 100, "max_items": 1000, "batch_cost": padded, **kwargs}
    return BatchQueue(**options)


def request(
    costs: list[int], *, priority: int = 0, deadline: float = 1e18, done: list[Request] | None = None
) -> Request:
    prepared = [Prepared(i, cost, cost, None) for i, cost in enumerate(costs)]
    sink = done if done is not None else []
    return Request(prepared, priority=priority, deadline=deadline, on_done=sink.append)


def test_batches_respect_the_token_budget_with_padding_counted() -> None:
    queue = make_queue()
    queue.put(request([10] * 30))
    sizes = []
    while (batch := queue.next_batch(timeout=0)) is not None:
        assert batch.cost <= 100
        sizes.append(len(batch.entries))
    assert sizes == [10, 10, 10]


def test_window_is_sorted_by_length_to_cut_padding() -> None:
    queue = make_queue(max_batch_tokens=40)
    queue.put(request([1, 20, 1, 20, 1, 20, 1, 20]))
    first = queue.next_batch(timeout=0)
    assert first is not None
    assert sorted(e.prepared.cost for e in first.entries) == [1, 1, 1, 1]
    second = queue.next_batch(timeout=0)
    assert second is not None
    assert [e.prepared.cost for e in second.entries] == [20, 20]


def test_an_item_over_the_budget_still_runs_alone() -> None:
    queue = make_queue(max_batch_tokens=10)
    queue.put(request([50, 3]))
    costs = []
    while (batch := queue.next_batch(timeout=0)) is not None:
        costs.append([e.prepared.cost for e in batch.entries])
    assert sorted(costs) == [[3], [50]]


def test_small_requests_jump_the_bulk_backlog_and_run_in_their_own_batch() -> None:
    queue = make_queue(small_request_items=2)
    bulk = request([5] * 200)
    queue.put(bulk)
    first = queue.next_batch(timeout=0)
    assert first is not None
    interactive = request([5])
    queue.put(interactive)
    assert interactive.priority == 0  # priority is given by the engine; here the request sets it
    prioritised = request([5], priority=queue.priority_for(1, None))
    queue.put(prioritised)
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert {e.request for e in batch.entries} == {prioritised}


def test_explicit_priority_overrides_the_size_rule() -> None:
    queue = make_queue(small_request_items=2)
    assert queue.priority_for(1, None) == 1
    assert queue.priority_for(100, None) == 0
    assert queue.priority_for(1, -5) == -5


def test_outranks_says_when_higher_priority_work_waits() -> None:
    queue = make_queue()
    queue.put(request([5] * 10))
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert not queue.outranks(batch)
    queue.put(request([5], priority=1))
    assert queue.outranks(batch)


def test_cancelled_requests_are_dropped_before_compute() -> None:
    queue = make_queue()
    gone = request([5] * 10)
    kept = request([5] * 2)
    queue.put(gone)
    queue.put(kept)
    gone.cancel()
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert {e.request for e in batch.entries} == {kept}
    assert queue.depth == 0


def test_expired_requests_fail_with_deadline_exceeded() -> None:
    now = [0.0]
    done: list[Request] = []
    queue = make_queue(clock=lambda: now[0])
    late = request([5], deadline=1.0, done=done)
    queue.put(late)
    now[0] = 2.0
    assert queue.next_batch(timeout=0) is None
    assert done == [late]
    assert isinstance(late.error, DeadlineExceeded)


def test_a_full_queue_refuses_the_whole_request_with_a_retry_hint() -> None:
    queue = make_queue(max_items=10)
    queue.put(request([1] * 8))
    with pytest.raises(Overloaded) as raised:
        queue.put(request([1] * 3))
    assert raised.value.retry_after >= 1
    assert queue.depth == 8


def test_requeue_puts_entries_back_in_order() -> None:
    queue = make_queue(max_batch_tokens=1000)
    first = request([1, 2, 3])
    queue.put(first)
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    queue.requeue(batch.entries)
    again = queue.next_batch(timeout=0)
    assert again is not None
    assert [e.prepared.index for e in again.entries] == [0, 1, 2]


def test_groups_never_share_a_batch() -> None:
    queue = make_queue(max_batch_tokens=1000)
    prepared = [Prepared(0, 1, 1, None, group="text"), Prepared(1, 1, 1, None, group="image")]
    queue.put(Request(prepared, priority=0, deadline=1e18, on_done=lambda r: None))
    groups = []
    while (batch := queue.next_batch(timeout=0)) is not None:
        groups.append({e.prepared.group for e in batch.entries})
    assert groups == [{"text"}, {"image"}]


def order_of(queue: BatchQueue, names: dict[Request, str], batches: int) -> str:
    taken = ""
    for _ in range(batches):
        batch = queue.next_batch(timeout=0)
        assert batch is not None
        taken += "".join(sorted({names[e.request] for e in batch.entries}))
    return taken


def test_requests_of_one_class_share_the_model_fairly() -> None:
    queue = make_queue(max_batch_tokens=10)
    a, b = request([10] * 4), request([10] * 4)
    queue.put(a)
    queue.put(b)
    assert order_of(queue, {a: "A", b: "B"}, 8) == "ABABABAB"


def test_a_late_request_joins_at_the_service_level_of_its_class_not_at_zero() -> None:
    queue = make_queue(max_batch_tokens=10)
    a, c = request([10] * 6), request([10] * 3)
    names = {a: "A", c: "C"}
    queue.put(a)
    assert order_of(queue, names, 2) == "AA"
    queue.put(c)
    assert order_of(queue, names, 7) == "ACACACA"


def small_queries_beside_bulk(steps: int, batch_seconds: float) -> str:
    """One bulk request of 20 batches, then a small query arriving before each of `steps` batches
    that take `batch_seconds` each (aging after 1 s): the order the batches are taken in."""
    now = [0.0]
    queue = make_queue(max_batch_tokens=10, aging=1.0, clock=lambda: now[0])
    bulk = request([10] * 20, priority=0)
    queue.put(bulk)
    names = {bulk: "B"}
    taken = ""
    for step in range(steps):
        now[0] = step * batch_seconds
        small = request([10], priority=1)
        names[small] = "S"
        queue.put(small)
        taken += order_of(queue, names, 1)
    return taken


def test_bulk_work_ages_past_a_steady_stream_of_small_queries() -> None:
    # One aged bulk batch per second of waiting; the small queries run in every other turn.
    assert small_queries_beside_bulk(12, 0.25) == "SSSSBSSSBSSS"


def test_with_batches_slower_than_the_aging_interval_small_queries_keep_every_other_batch() -> None:
    # Each batch takes two aging intervals.
    assert small_queries_beside_bulk(6, 2.0) == "SBSBSB"


def test_an_aged_batch_is_not_given_back_when_higher_work_arrives() -> None:
    now = [0.0]
    queue = make_queue(max_batch_tokens=10, aging=1.0, clock=lambda: now[0])
    queue.put(request([10] * 3, priority=0))
    queue.put(request([10] * 3, priority=1))
    now[0] = 1.0
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert (batch.priority, batch.aged) == (0, True)
    assert not queue.outranks(batch)


def test_entries_requeued_after_close_fail_at_once_as_unavailable() -> None:
    done: list[Request] = []
    queue = make_queue()
    waiting = request([5, 5], done=done)
    queue.put(waiting)
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    queue.close()
    queue.requeue(batch.entries)
    assert done == [waiting]
    assert isinstance(waiting.error, ModelUnavailable)


def test_a_sort_window_holds_at_most_window_items_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    # A budget of 10,000 would take all 100 one-token items; the window caps what one batch sorts.
    monkeypatch.setattr("model_registry.runtime.batching.WINDOW_ITEMS", 8)
    queue = make_queue(max_batch_tokens=10_000)
    queue.put(request([1] * 100))
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert [e.prepared.index for e in batch.entries] == list(range(8))


def test_the_sort_window_spans_sixteen_batches_so_lengths_group_across_requests() -> None:
    # The head request (a short item, then 100 long ones) and a request of 50 short items: a window
    # of 16 batches' worth (1,600) takes both, and the head's short item runs with the other
    # request's (51 items, no padding); a window of 4 (400) would hold the head request alone and
    # pad its short item into a batch of tens.
    queue = make_queue()
    queue.put(request([1] + [10] * 100))
    queue.put(request([1] * 50))
    batch = queue.next_batch(timeout=0)
    assert batch is not None
    assert [e.prepared.cost for e in batch.entries] == [1] * 51
    assert batch.cost == 51


# ---- the waiting side, driven from a second thread ---------------------------------------------

WAIT = 5.0


def waiting(queue: BatchQueue, **kwargs: Any) -> Callable[[], Batch | None]:
    """Call `queue.next_batch(**kwargs)` on another thread; the returned function waits for its
    answer (failing the test if none comes within `WAIT`)."""
    answers: SimpleQueue[Batch | None] = SimpleQueue()
    worker = threading.Thread(target=lambda: answers.put(queue.next_batch(**kwargs)), daemon=True)
    worker.start()

    def answer() -> Batch | None:
        worker.join(WAIT)
        assert not worker.is_alive(), "next_batch did not return"
        return answers.get_nowait()

    return answer


def test_a_waiting_next_batch_returns_work_put_from_another_thread() -> None:
    queue = make_queue()
    answer = waiting(queue, timeout=60.0)
    put = request([5, 5])
    queue.put(put)
    batch = answer()
    assert batch is not None
    assert {e.request for e in batch.entries} == {put}
    assert queue.depth == 0


def test_wake_ends_a_wait_whose_condition_came_true() -> None:
    queue = make_queue()
    stop = threading.Event()
    answer = waiting(queue, timeout=60.0, until=stop.is_set)
    stop.set()
    queue.wake()
    assert answer() is None


def test_close_ends_a_wait_and_hands_back_the_waiting_requests() -> None:
    queue = make_queue()
    answer = waiting(queue, timeout=60.0, until=lambda: False)
    assert queue.close() == []
    assert answer() is None
    with pytest.raises(ModelUnavailable):
        queue.put(request([5]))


def test_close_returns_the_requests_still_waiting() -> None:
    queue = make_queue()
    first, second = request([5]), request([5, 5])
    queue.put(first)
    queue.put(second)
    assert queue.close() == [first, second]
    assert (queue.depth, queue.pending_cost) == (0, 0)
    assert queue.next_batch(timeout=0) is None


def test_on_put_is_called_once_per_put_that_queued_work() -> None:
    queue = make_queue()
    depths: list[int] = []
    queue.on_put = lambda: depths.append(queue.depth)
    queue.put(request([5, 5]))
    queue.put(request([]))
    queue.put(request([5]))
    assert depths == [2, 3]  # called after the items are counted, so a reader sees them


def test_the_measured_rate_sets_the_retry_hint_of_a_full_queue() -> None:
    queue = make_queue(max_items=4)
    queue.put(request([50, 50, 50, 50]))
    queue.record(10, 0.5)  # 20 cost per second
    queue.record(10, 0.25)  # 40: smoothed to 0.8 * 20 + 0.2 * 40 = 24
    assert queue.rate == pytest.approx(24.0)
    with pytest.raises(Overloaded) as raised:
        queue.put(request([1]))
    assert raised.value.retry_after == 9.0  # 200 cost waiting at 24 per second, rounded up
