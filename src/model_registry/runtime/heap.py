"""Loaded models out of the cyclic garbage collector's way.

A loaded model brings hundreds of thousands of Python objects that live as long as it does: the
modules of torch, transformers and the engines, the tokenizer, the model's own. CPython's
collector walks every one of them in each full collection, and under a bulk load a full
collection comes every second or so, because requests in flight survive the young generations.
Each one holds the interpreter lock for a long pause (docs/lifecycle.md): every thread of the
server stops, the event loop and every other model's workers included.

So after each load `freeze` collects what is not frozen yet (the new model's objects and what was
made since the last freeze, not the whole heap: a load must not stop the models already serving
for a walk over all of them) and freezes what survives (`gc.freeze`); later collections leave it
out and walk only what was made since. After each unload `collect` thaws the heap and walks all of
it once, so that the unloaded model's own cycles go, then freezes it again. What becomes cyclic
garbage after being frozen (a request in flight at that moment that ends in a reference cycle,
say) waits for the next unload.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()


def freeze() -> None:
    """A collection of what is not frozen yet; then freeze what is left."""
    with _lock:
        gc.collect()
        gc.freeze()


def collect() -> None:
    """A full collection over the whole heap, the frozen part included; then freeze what is left."""
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
