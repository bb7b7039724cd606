"""Stand-ins for what this machine lacks, for `bench_batches.py --stand-in`: a fast device.

On a GPU the engine takes a few milliseconds per batch and releases the interpreter lock while the
device works, so the server's own Python work around it (parsing, tokenizing, batching, results)
decides the throughput. `stand_in` gives a CPU-only machine that regime: the ONNX Runtime engine's
`run` becomes a sleep of a fixed time per padded token (the lock is released, as during a device
sync) that returns a last hidden state of ones, 8 wide, so that pooling costs next to nothing.

`without_freeze` turns `gc.freeze` into a no-op: the server as it was before `model_registry.heap`
froze loaded models out of the collector's walks, for an A/B run in the same conditions.

`collector_thresholds` sets the collector's generation thresholds (`gc.set_threshold`) in the
server, for `bench_batches.py --gc-thresholds`.

In the server's process these are applied by `hooks/sitecustomize.py` from the environment
(`BENCH_STAND_IN`, `BENCH_WITHOUT_FREEZE`, `BENCH_GC_THRESHOLDS`), which `bench_batches.py` sets.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np


def stand_in(seconds_per_token: float) -> None:
    from model_registry.backends import onnx
    from model_registry.backends.base import EncoderBatch, EncoderOutput

    def run(self: Any, batch: EncoderBatch) -> EncoderOutput:
        rows, tokens = batch.input_ids.shape
        time.sleep(seconds_per_token * rows * tokens)
        return EncoderOutput(hidden=np.ones((rows, tokens, 8), dtype=np.float32))

    onnx.OnnxEngine.run = run  # type: ignore[method-assign]


def without_freeze() -> None:
    gc.freeze = lambda: None


def collector_thresholds(spec: str) -> None:
    """`spec` is gc.set_threshold's arguments, comma-separated: "700,10,10"."""
    gc.set_threshold(*(int(t) for t in spec.split(",")))
