"""A real, registered adapter with no weights, for tests and demos of the serving machinery.

Each word is a token. The vector of a text is a deterministic function of its words, so results
can be checked exactly. Options (the model entry's `options`):
- `dimensions` (8): vector width;
- `delay` (0.0): seconds each batch's forward takes;
- `fail_on` (none): a word that makes the whole batch holding it raise in `forward`;
- `max_length` (512): longest input in words;
- `footprint` (4 * dimensions): the bytes it declares it holds while loaded;
- `allocate` (false): really hold `footprint` bytes of host memory while loaded;
- `load_delay` (0.0): seconds a load takes;
- `load_error` (none): a message the load raises with, after it has allocated its memory;
- `unload_errors` (0): how many unloads raise before the memory is given back.

`held_bytes()` says how many bytes all fake models hold right now, whatever became of them.
"""

from __future__ import annotations

import hashlib
import mmap
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.errors import InputTooLong, InvalidInput, UnsupportedOperation
from model_registry.types import Capability, Embedding, EmbedItem, Item, Kind, Output, Prepared, Result, Text

_held_lock = threading.Lock()
_held_total = [0]


def held_bytes() -> int:
    """Bytes that fake models with `allocate` hold now (loaded, half loaded or leaked)."""
    with _held_lock:
        return _held_total[0]


def _count_held(delta: int) -> None:
    with _held_lock:
        _held_total[0] += delta


def fake_vector(text: str, dimensions: int) -> np.ndarray:
    """The unit vector the fake model gives `text`: seeded by a hash of its words."""
    seed = int.from_bytes(hashlib.sha256(" ".join(text.split()).encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeAdapter(Adapter):
    kind = Kind.FAKE
    capabilities = frozenset({Capability.EMBED_TEXT})
    backend = "fake"

    def __init__(self, options: dict[str, Any]) -> None:
        self.width = int(options.get("dimensions", 8))
        self.dimensions = self.width
        self.delay = float(options.get("delay", 0.0))
        self.fail_on = options.get("fail_on")
        self.limit = int(options.get("max_length", 512))
        self.max_length = self.limit
        self.declared = int(options.get("footprint", 4 * self.width))
        self.allocate = bool(options.get("allocate", False))
        self.load_delay = float(options.get("load_delay", 0.0))
        self.load_error = options.get("load_error")
        self.unload_errors = int(options.get("unload_errors", 0))
        self.batches: list[int] = []
        self.loaded = False
        self._held: mmap.mmap | None = None

    def load(self, options: LoadOptions) -> None:
        if self.load_delay:
            time.sleep(self.load_delay)
        if self.allocate:
            # An anonymous mapping of its own, written to so that the pages are resident: it goes
            # back to the system when closed, whatever the allocator does with freed heap.
            size, page = max(1, self.declared), mmap.PAGESIZE
            self._held = mmap.mmap(-1, size)
            for offset in range(0, size, page):
                self._held[offset] = 1
            _count_held(size)
        if self.load_error is not None:
            raise RuntimeError(str(self.load_error))
        self.loaded = True

    def unload(self) -> None:
        if self.unload_errors > 0:
            self.unload_errors -= 1
            raise RuntimeError("injected failure: the unload raised")
        if self._held is not None:
            _count_held(-len(self._held))
            self._held.close()
        self._held = None
        self.loaded = False

    def estimate(self, options: LoadOptions) -> int:
        return self.declared

    def footprint(self) -> int:
        return self.declared

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for i, item in enumerate(items):
            if not isinstance(item, EmbedItem) or not isinstance(item.content, Text):
                raise InvalidInput(f"input {i}: the fake model embeds text only", param="input")
            if item.outputs != {Output.DENSE}:
                raise UnsupportedOperation("the fake model produces dense vectors only", param="outputs")
            words = (item.prompt + item.content.text).split()
            if len(words) > self.limit:
                if not item.truncate:
                    raise InputTooLong(
                        f"input {i} has {len(words)} tokens, more than the model's limit of {self.limit}",
                        param="input",
                    )
                words = words[: self.limit]
            prepared.append(Prepared(i, max(1, len(words)), len(words), " ".join(words)))
        return prepared

    def collate(self, items: Sequence[Prepared]) -> list[str]:
        return [str(p.data) for p in items]

    def forward(self, batch: list[str]) -> list[np.ndarray]:
        self.batches.append(len(batch))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and any(self.fail_on in text.split() for text in batch):
            raise RuntimeError(f"injected failure: a batch held '{self.fail_on}'")
        return [fake_vector(text, self.width) for text in batch]

    def postprocess(self, batch: list[str], output: list[np.ndarray]) -> list[Result]:
        return [Embedding(dense=vector) for vector in output]
