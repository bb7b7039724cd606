"""Loaded models out of the cyclic garbage collector's way.

A loaded model brings hundreds of thousands of Python objects that live as long as it does: the
modules of torch, transformers and the engines, the tokenizer, the model's own. CPython's
collector walks every one of them in each full collection, and under a bulk load a full
collection comes every second or so, because requests in flight survive the young generations.
Each one holds the interpreter lock for 100-200 ms with the bundled model: every thread of the
server stops, the event loop and every other model's workers included.

So after each load and each unload, `collect` walks the whole heap once, then freezes what
survives (`gc.freeze`): later collections leave it out and walk only what was made since. What
becomes cyclic garbage after being frozen (a request in flight at that moment that ends in a
reference cycle, say) waits for the next load or unload.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()


def collect() -> None:
    """A full collection over the whole heap, the frozen part included; then freeze what is left."""
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
