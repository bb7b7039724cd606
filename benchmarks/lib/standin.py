"""Stand-ins for what this machine lacks, for `bench_batches.py --stand-in`: a fast device.

On a GPU the engine takes a few milliseconds per batch and releases the interpreter lock while the
device works, so the server's own Python work around it (parsing, tokenizing, batching, results)
decides the throughput. `stand_in` gives a CPU-only machine that regime: the ONNX Runtime engine's
`run` becomes a sleep of a fixed time per padded token (the lock is released, as during a device
sync) that returns a last hidden state of ones, 8 wide by default, so that pooling costs next to
nothing; `width` 384 returns the bundled model's width, so that the host pools states of a real
size, as for an engine whose outputs come back to the host. With `ops`, each batch first launches
that many operations one at a time, as eager torch does on a GPU: each releases the lock for a few
microseconds of work and takes it back, so that a thread holding the lock meanwhile delays the
next launch.

`switch_interval` sets the interpreter's switch interval (`sys.setswitchinterval`) in the server,
for `bench_batches.py --switch-interval`.

`without_freeze` turns `gc.freeze` into a no-op: the server without `model_registry.runtime.heap`'s freeze
of loaded models out of the collector's walks, for an A/B run in the same conditions.

`collector_thresholds` sets the collector's generation thresholds (`gc.set_threshold`) in the
server, for `bench_batches.py --gc-thresholds`.

In the server's process these are applied by `../hooks/sitecustomize.py` from the environment
(`BENCH_STAND_IN`, `BENCH_STAND_IN_OPS`, `BENCH_WITHOUT_FREEZE`, `BENCH_GC_THRESHOLDS`,
`BENCH_SWITCH_INTERVAL`, `BENCH_STAND_IN_WIDTH`), which `bench_batches.py` sets.
"""

from __future__ import annotations

import gc
import hashlib
import sys
import time
from typing import Any

import numpy as np

#: What one operation's launch hashes: about 9 µs of work outside the interpreter lock.
_LAUNCH = bytes(16384)


def stand_in(seconds_per_token: float, ops: int = 0, width: int = 8) -> None:
    """`ops` > 0: the engine first launches that many operations one at a time, as eager torch does
    on a GPU, each about 9 µs of work with the interpreter lock released (hashing 16 KiB), then
    waits for the device."""
    from model_registry.backends.base import EncoderBatch, EncoderOutput
    from model_registry.backends.onnx import engine as onnx

    def run(self: Any, batch: EncoderBatch) -> EncoderOutput:
        rows, tokens = batch.input_ids.shape
        for _ in range(ops):
            hashlib.sha256(_LAUNCH)
        time.sleep(seconds_per_token * rows * tokens)
        return EncoderOutput(hidden=np.ones((rows, tokens, width), dtype=np.float32))

    onnx.OnnxEngine.run = run  # type: ignore[method-assign]


def switch_interval(seconds: float) -> None:
    sys.setswitchinterval(seconds)


def without_freeze() -> None:
    gc.freeze = lambda: None


def collector_thresholds(spec: str) -> None:
    """`spec` is gc.set_threshold's arguments, comma-separated: "700,10,10"."""
    gc.set_threshold(*(int(t) for t in spec.split(",")))
