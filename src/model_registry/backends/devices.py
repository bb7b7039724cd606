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
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

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
    loses nothing."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="cpu-torch", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` on this thread; its result, or its exception raised here."""
        future: Future[T] = Future()
        self._work.put((fn, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            fn, future = self._work.get()
            try:
                future.set_result(fn())
            except BaseException as error:  # raised again on the caller's thread
                future.set_exception(error)


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
