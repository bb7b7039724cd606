"""Stage times recorded by the engine, read in-process with `recording()`."""

from __future__ import annotations

import asyncio
import time

from model_registry import Registry
from model_registry.runtime.timing import recording

DELAY = 0.1


def config(max_batch_tokens: int) -> dict[str, object]:
    model = {"name": "fake", "source": "fake", "kind": "fake", "pin": True, "options": {"delay": DELAY}}
    return {"models": [{**model, "max_batch_tokens": max_batch_tokens}]}


async def test_one_run_records_its_stages_in_order() -> None:
    async with Registry.from_config(config(64)) as registry:
        before = time.time()
        with recording() as stages:
            await registry.embed("fake", ["a b", "c"])
        after = time.time()
    assert len(stages) == 1
    times = stages[0]
    assert (times.model, times.items, times.tokens) == ("fake", 2, 3)
    assert len(times.batches) == 1
    batch = times.batches[0]
    assert before <= times.prepare_start <= times.enqueued <= batch.forward_start
    assert batch.forward_start <= batch.forward_end <= batch.postprocess_end <= times.finished <= after
    assert times.forward_seconds >= DELAY
    assert (batch.items, batch.cost, batch.tokens, batch.capacity) == (2, 4, 3, 64)


async def test_a_request_split_over_batches_sums_them_and_waits_behind_the_first() -> None:
    async with Registry.from_config(config(1)) as registry:  # one item per batch
        with recording() as stages:
            await registry.embed("fake", ["a", "b", "c"])
    times = stages[0]
    assert len(times.batches) == 3
    assert times.forward_seconds >= 3 * DELAY
    assert times.queue_seconds < DELAY  # queue wait ends at its first batch


async def test_concurrent_runs_each_record_their_own_and_nothing_outside() -> None:
    async with Registry.from_config(config(1)) as registry:
        await registry.embed("fake", ["outside"])  # no recording: a no-op

        async def one(text: str) -> list[float]:
            with recording() as stages:
                await registry.embed("fake", [text])
            return [s.queue_seconds for s in stages]

        first, second = await asyncio.gather(one("first"), one("second"))
    assert len(first) == len(second) == 1
    # One batch at a time: whichever ran second waited about one forward pass.
    assert max(first[0], second[0]) >= DELAY / 2
