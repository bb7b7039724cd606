"""How an engine uses the CPU's cores while it holds the device's compute slot
(`devices.compute_slot`: one forward pass per device at a time, each with every core).

Its intra-op threads are sized to the cores (torch's process-wide pool, ONNX Runtime's and
CTranslate2's per-model pools). ONNX Runtime and CTranslate2 on CPU also cut a batch of several
rows into two row ranges (`lanes`) run at once over the same weights (`run_in_lanes`: one ONNX
Runtime session called from two threads, or two CTranslate2 replicas sharing the weights); a
single row runs alone with every thread. Two independent runs seldom wait on each other, while
one engine's pool waits for all its threads at every operator. Figures: docs/backends.md.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

_guard = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def cores() -> int:
    """Cores this process may run on (its affinity, which containers' cpusets narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def intra_op_threads(requested: int | None) -> int:
    return max(1, requested or cores())


#: Lanes a CPU batch is cut across by default. Two, not one per core: each lane's run keeps the
#: engine's intra-op threads, so that a single row still has the cores, and more lanes would
#: oversubscribe them (measured on 2 cores only; docs/backends.md).
LANES = 2


def lanes(requested: int | None) -> int:
    """Lanes a CPU batch is cut across: as configured, else `LANES` where there are that many cores."""
    return max(1, requested or min(LANES, cores()))


def row_ranges(rows: int, parts: int) -> list[slice]:
    """`rows` cut into `min(parts, rows)` contiguous ranges whose sizes differ by at most one."""
    parts = max(1, min(parts, rows))
    bounds = [rows * i // parts for i in range(parts + 1)]
    return [slice(start, end) for start, end in itertools.pairwise(bounds)]


def run_in_lanes(work: Callable[[slice], np.ndarray], rows: int, count: int) -> np.ndarray:
    """`work(range)` for each of `rows` cut into up to `count` ranges, all at once: the first on
    the calling thread, the others on the lane threads; their arrays joined in row order. When a
    lane raises, the others are still waited for (none outlives the caller's compute slot), then
    it is raised."""
    ranges = row_ranges(rows, count)
    if len(ranges) == 1:
        return work(ranges[0])
    others = [_lane_pool().submit(work, part) for part in ranges[1:]]
    try:
        first = work(ranges[0])
    finally:
        wait(others)
    return np.concatenate([first, *(future.result() for future in others)])


#: At most this many lane threads; they are started as lanes first need them (one fewer than the
#: most lanes a model runs), and the CPU's slot lets one forward pass use them at a time.
_MAX_LANE_THREADS = 256


def _lane_pool() -> ThreadPoolExecutor:
    """The lane threads, shared by every model."""
    global _pool
    with _guard:
        if _pool is None:
            _pool = ThreadPoolExecutor(_MAX_LANE_THREADS, thread_name_prefix="engine-lane")
        return _pool
