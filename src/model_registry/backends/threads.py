"""One compute pool per device, shared by every model and engine.

Each engine sizes its intra-op threads to the cores (torch's process-wide pool, ONNX Runtime's and
CTranslate2's per-model pools), and every forward pass on a device holds that device's slot while
it runs: two models called at once take turns, each with every core, instead of running 2 x cores
threads on the cores (oversubscription: both slower than in turn, and latency that jitters).
Tokenizing and pooling run outside the slot, so they overlap the other model's forward.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_slots: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def cores() -> int:
    """Cores this process may run on (its affinity, which containers' cpusets narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def intra_op_threads(requested: int | None) -> int:
    return max(1, requested or cores())


@contextmanager
def compute_slot(device: str) -> Iterator[None]:
    """Hold `device`'s slot for one forward pass (CUDA devices each have their own slot)."""
    key = "cpu" if not device.startswith("cuda") else device if ":" in device else "cuda:0"
    with _guard:
        slot = _slots.setdefault(key, threading.Lock())
    with slot:
        yield
