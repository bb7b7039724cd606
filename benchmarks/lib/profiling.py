"""torch.profiler over a window of batches, in the server and in-process alike, for
`bench_batches.py --profile DIR`: where a batch's time goes when the server serves a fraction of
its engine's in-process rate.

A `Window` counts the batches it is given (`around`), lets the first `skip` run as they are (warm
kernels, a settled allocator), profiles the next `count` on the thread that runs them (the
forward pass and the heads: the worker's `_compute`, or the in-process loop's forward and
postprocess), and then writes `<name>.txt`: the batches profiled, their wall time from the first's
start to the last's end, and the operators by their own CUDA time (CPU time where no GPU ran) and
by their own CPU time. In the server it is applied by `../hooks/sitecustomize.py` from
`BENCH_PROFILE` (the directory) and `BENCH_PROFILE_NAME` (the files' prefix), which `bench_batches.py` sets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SKIP, COUNT = 10, 10
_ROWS = 30


class Window:
    def __init__(self, directory: Path, name: str, skip: int = SKIP, count: int = COUNT) -> None:
        self.path = directory / f"{name}.txt"
        self.skip, self.count = skip, count
        self._seen = 0
        self._lock = threading.Lock()
        self._profile: Any = None
        self._started = 0.0

    def around(self, fn: Callable[[], T]) -> T:
        """`fn()`, profiled when it is one of the window's batches."""
        with self._lock:
            index = self._seen
            self._seen += 1
        if index < self.skip or index >= self.skip + self.count:
            return fn()
        if index == self.skip:
            self._start()
        try:
            return fn()
        finally:
            if index == self.skip + self.count - 1:
                self._stop()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profile = profile(activities=activities)
        self._profile.__enter__()
        self._started = time.perf_counter()

    def _stop(self) -> None:
        import torch

        on_gpu = torch.cuda.is_available()
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._started
        self._profile.__exit__(None, None, None)
        averages = self._profile.key_averages()
        first = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            f"{self.count} batches after {self.skip}, {1e3 * wall:.1f} ms from the first's start to the last's end\n\n"
            f"by {first}:\n{averages.table(sort_by=first, row_limit=_ROWS)}\n\n"
            f"by self_cpu_time_total:\n{averages.table(sort_by='self_cpu_time_total', row_limit=_ROWS)}\n"
        )
        self._profile = None


def in_server(directory: Path, prefix: str) -> None:
    """Profile the server's batches: every model's `_compute` (forward pass and heads) goes
    through one window per model, written as `<prefix>-<model>.txt`."""
    from model_registry.runtime import worker

    windows: dict[str, Window] = {}
    compute = worker.Worker._compute

    def profiled(self: worker.Worker, collated: Any) -> Any:
        window = windows.setdefault(self.name, Window(directory, f"{prefix}-{self.name}"))
        return window.around(lambda: compute(self, collated))

    worker.Worker._compute = profiled  # type: ignore[method-assign]
