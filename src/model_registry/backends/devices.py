"""Per-device state, one owner: which device a model's memory lives on, and the two locks each
device has in this process.

- The gate (`gate`): many batches run on a device at once, or one load measures its memory alone,
  so that CUDA's per-device peak counter reads that load's own peak.
- The compute slot (`compute_slot`): one forward pass at a time per device, each with every core,
  instead of two models' thread pools oversubscribing the same cores.
- The CPU's torch thread (`torch_thread`): where every torch model on the CPU runs its forward
  passes and heads, so that the process has one OpenMP pool.

Nothing here imports torch unless a CUDA device is asked about.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def memory_device(requested: str) -> str:
    """The device whose memory a model with `device: requested` will use ('cpu' or 'cuda:N')."""
    if requested == "auto":
        return "cuda:0" if cuda_available() else "cpu"
    if requested == "cuda":
        return "cuda:0"
    return requested


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device; never imports torch needlessly."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


class DeviceGate:
    """Lets many batches run on a device at once (`shared`), or one measurement alone (`exclusive`).

    CUDA's peak-memory counter is per device, not per model: while a load measures its warm-up,
    other models' batches on the same device wait, so the peak it reads is its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._measuring = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._measuring)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._measuring)
            self._measuring = True
            self._cond.wait_for(lambda: self._running == 0)
        try:
            yield
        finally:
            with self._cond:
                self._measuring = False
                self._cond.notify_all()


_gates: dict[str, DeviceGate] = {}
_slots: dict[str, threading.Lock] = {}
_registering = threading.Lock()


def gate(device: str) -> DeviceGate:
    """The gate of `device` ('cpu', 'cuda:0', ...), one per process."""
    with _registering:
        return _gates.setdefault(device, DeviceGate())


@contextlib.contextmanager
def compute_slot(device: str) -> Iterator[None]:
    """Hold `device`'s slot for one forward pass (CUDA devices each have their own slot)."""
    key = "cpu" if not device.startswith("cuda") else device if ":" in device else "cuda:0"
    with _registering:
        slot = _slots.setdefault(key, threading.Lock())
    with slot:
        yield


class TorchThread:
    """One thread that runs the CPU work of every torch model, in the order it is handed in.

    torch's parallel operators run on an OpenMP pool that belongs to the calling thread; with a
    forward thread per model, two torch models kept two pools, more OpenMP threads than cores,
    and libgomp then stops its threads spinning between operators: each forward pass took 1.3x as
    long on 2 cores. The compute slot already runs one forward pass at a time, so one thread
    loses nothing.

    Its pool's threads are bound one to a core, this thread to the first (`pin_pool`):
    left free, the scheduler put a pool thread woken after an idle spell on the core its master
    was using, and a forward pass after 45 ms idle took twice as long (an idle MiniLM sentence
    over HTTP on 2 cores: 17-20 ms of inference free, 8.8-8.9 bound)."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self.pool: list[int] = []  # its pool's threads, once bound
        self._thread = threading.Thread(target=self._serve, name="cpu-torch", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` on this thread; its result, or its exception raised here."""
        future: Future[T] = Future()
        self._work.put((fn, future))
        return future.result()

    def _serve(self) -> None:
        first = True
        while True:
            fn, future = self._work.get()
            if first:  # the work is torch's, so torch is installed
                first = False
                self.pool = pin_pool()
            try:
                future.set_result(fn())
            except BaseException as error:  # raised again on the caller's thread
                future.set_exception(error)


def pin_pool() -> list[int]:
    """Bind the calling thread's OpenMP pool one thread to a core, the calling thread to the first
    core: its pool's threads (their ids), or [] where it did not. It binds only where the process
    may use exactly as many cores as torch has threads (a machine or a cpuset of its own): on a
    share of a larger machine every replica would bind to the same first cores. Also [] with one
    thread, or when other threads started meanwhile and its own could not be told apart.
    `OMP_PROC_BIND` cannot do this: it binds the thread that loads torch, and every thread that
    thread starts afterwards, to one core."""
    if not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir():
        return []
    import torch

    cpus = sorted(os.sched_getaffinity(0))
    count = torch.get_num_threads()
    if not 2 <= count == len(cpus):
        return []
    before = _tasks()
    torch.ones(count * 64, 4096).sum()  # a parallel operator: the pool starts its threads
    pool = sorted(_tasks() - before)
    if len(pool) != count - 1:
        return []
    try:
        os.sched_setaffinity(0, {cpus[0]})
        for cpu, thread in zip(cpus[1:], pool, strict=False):
            os.sched_setaffinity(thread, {cpu})
    except OSError:  # a container that forbids it: the pool stays free
        log.warning("binding torch's CPU threads to cores failed; they stay free", exc_info=True)
        return []
    return pool


def _tasks() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


_torch_thread: TorchThread | None = None


def _forget_torch_thread() -> None:
    global _torch_thread
    _torch_thread = None  # a forked child has no copy of the thread: it starts its own


os.register_at_fork(after_in_child=_forget_torch_thread)


def torch_thread() -> TorchThread:
    """The CPU's torch thread, started on first use."""
    global _torch_thread
    with _registering:
        if _torch_thread is None:
            _torch_thread = TorchThread()
        return _torch_thread


def compute_thread(backend: str, device: str) -> TorchThread | None:
    """Where a model of `backend` on `device` (its memory device) computes: the CPU's torch thread
    for a torch model on the CPU, else None (the caller's own thread)."""
    return torch_thread() if backend == "torch" and device == "cpu" else None


_timings: dict[str, threading.Lock] = {}


def timing(device: str) -> threading.Lock:
    """Held while one model times its warm-up batches on `device`: two models timed at once (pinned
    models load together) would each measure the other's batches too."""
    with _registering:
        return _timings.setdefault(device, threading.Lock())
