"""Bounded polls for state a worker or a background task writes after a response has gone out.

A test that reads such state (a metric, a cache entry, a batch job's file, the event log) right after
its answer races the thread that writes it. It waits for the state instead, up to a deadline with
headroom for a loaded two-core machine, never for a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Long enough for a busy CI machine; a passing check returns at its first success.
DEADLINE = 20.0
_STEP = 0.01


def eventually(read: Callable[[], T], accept: Callable[[T], bool] = bool, *, deadline: float = DEADLINE) -> T:
    """Call `read` until `accept` holds for its value, and return that value; at the deadline, fail
    with the last value read (an exception raised by `read` counts as not yet, until then)."""
    ends = time.monotonic() + deadline
    while True:
        try:
            value = read()
        except Exception:
            if time.monotonic() >= ends:
                raise
        else:
            if accept(value):
                return value
            if time.monotonic() >= ends:
                raise AssertionError(f"not reached within {deadline:g} s; last read: {value!r}")
        time.sleep(_STEP)


async def eventually_async(
    read: Callable[[], Awaitable[T]], accept: Callable[[T], bool] = bool, *, deadline: float = DEADLINE
) -> T:
    """`eventually` for a coroutine read on the test's own event loop."""
    ends = time.monotonic() + deadline
    while True:
        try:
            value = await read()
        except Exception:
            if time.monotonic() >= ends:
                raise
        else:
            if accept(value):
                return value
            if time.monotonic() >= ends:
                raise AssertionError(f"not reached within {deadline:g} s; last read: {value!r}")
        await asyncio.sleep(_STEP)
