"""A content-addressed cache of model results, per model, off unless its entry has `cache:`.

An item's key hashes the model's identity (the contents of its files, the engine, precision,
device and every setting that changes what it computes) with the item itself: its text, token ids
or media bytes and the options that change its result (outputs, prompt, truncation, token limit).
Options applied after the model (`dimensions`, encodings) are not part of it. Results live in
memory under an LRU byte budget and optionally on disk (`disk:`, its own byte budget), where any
model whose identity is the same finds them.

Identical items inside one request are computed once; an item another request is computing is
waited for, not computed again (if that request fails or is cancelled, the waiter computes it).
Every caller is given arrays of its own, whichever way its answer was found.
Each `run` records how many of its distinct items were found and how many computed, read at the
edge with `recording()` (the `X-Cache` header and the hit ratio in `/metrics`).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.cache.keys import item_key, model_identity
from model_registry.config import CacheSpec, ModelSpec, parse_budget
from model_registry.types import Embedding, Item, Labels, Result, Results, Score, SparseVector

log = logging.getLogger(__name__)

#: What an entry costs beyond its result: the `Entry` and its size (88 bytes), its 64-character key
#: (113) and its place in the LRU (a node and up to six hash-table slots after a resize: up to 200).
_OVERHEAD = 416
#: A staging file untouched this long (seconds) belongs to no write still running.
_STALE_STAGING = 60.0

Compute = Callable[[list[Item]], Awaitable[Results]]


@dataclass(frozen=True, slots=True)
class Lookup:
    """One cached run: its distinct items found (in memory, on disk, or computed by another
    request) and computed."""

    model: str
    hits: int
    misses: int


_lookups: ContextVar[list[Lookup] | None] = ContextVar("model_registry_cache_lookups", default=None)


@contextmanager
def recording() -> Iterator[list[Lookup]]:
    """Collect the `Lookup` of every cached run finished inside the block."""
    collected: list[Lookup] = []
    token = _lookups.set(collected)
    try:
        yield collected
    finally:
        _lookups.reset(token)


def outcome(lookups: Sequence[Lookup]) -> str | None:
    """`hit` (nothing computed), `miss` (nothing found), `partial`, or None when no cache ran."""
    if not lookups:
        return None
    hits, misses = sum(x.hits for x in lookups), sum(x.misses for x in lookups)
    return "partial" if hits and misses else "hit" if hits else "miss"


# ---- entries ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    result: Result
    tokens: int
    size: int


def entry(result: Result, tokens: int) -> Entry:
    """A private copy of `result`, charged what it holds in memory."""
    copied = copied_result(result)
    return Entry(copied, tokens, _footprint(copied) + sys.getsizeof(tokens) + _OVERHEAD)


def copied_result(result: Result) -> Result:
    """`result` with arrays of its own: what a caller does to them never reaches the cache."""
    if isinstance(result, Embedding):
        sparse = result.sparse
        return Embedding(
            None if result.dense is None else result.dense.copy(),
            None if sparse is None else SparseVector(sparse.indices.copy(), sparse.values.copy(), sparse.tokens),
            None if result.multivector is None else result.multivector.copy(),
        )
    if isinstance(result, Labels):
        return Labels(result.logits.copy(), result.names)
    return result  # a Score holds no arrays: nothing in it can be changed


def _footprint(value: object) -> int:
    """Bytes `value` holds: itself, its fields and tuples' members, an array's data (it owns it)."""
    size = sys.getsizeof(value)
    if isinstance(value, tuple):
        return size + sum(_footprint(member) for member in value)
    if is_dataclass(value) and not isinstance(value, type):
        return size + sum(_footprint(getattr(value, field.name)) for field in fields(value))
    return size


class Memory:
    """Entries by key, least recently used dropped first; their sizes never sum above `budget`."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def get(self, key: str) -> Entry | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: str, value: Entry) -> None:
        if value.size > self.budget or key in self._entries:
            return
        while self.used + value.size > self.budget:
            _, dropped = self._entries.popitem(last=False)
            self.used -= dropped.size
        self._entries[key] = value
        self.used += value.size

    def __len__(self) -> int:
        return len(self._entries)


class Disk:
    """Entries as `.npz` files (read without pickle) under `directory`, oldest dropped first when
    their sizes pass `budget`; shared by every cached model that names the same directory.

    Each file is counted at the size it was written (or found) at and uncounted by that size when
    dropped. A write that fails (a full disk) is logged, and the result is still answered."""

    def __init__(self, directory: Path, budget: int) -> None:
        self.directory, self.budget = directory, budget
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _remove_leftovers(directory)
        found = sorted(_listing(directory, "*.npz"), key=lambda f: f[1].st_mtime_ns)
        self._sizes = OrderedDict((path.name, status.st_size) for path, status in found)  # oldest first
        self._lock = threading.Lock()  # puts come from several models' threads
        self._failing = False
        self.used = sum(self._sizes.values())

    def get(self, key: str) -> Entry | None:
        path = self.directory / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as stored:
                return _decode({name: stored[name] for name in stored.files})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as error:
            log.warning("the cached result %s is unreadable (%s); computing it again", path.name, error)
            return None

    def put_all(self, entries: dict[str, Entry]) -> None:
        for key, value in entries.items():
            self.put(key, value)

    def put(self, key: str, value: Entry) -> None:
        """Store `value` unless the store holds `key` already or it is larger than the whole budget."""
        name = f"{key}.npz"
        if name in self._sizes and (self.directory / name).exists():  # `_place` decides, under the lock
            return
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **_encode(value))
        data = buffer.getvalue()
        if len(data) > self.budget:
            return
        try:
            staging = self._stage(key, data)
        except OSError as error:
            self._failed(error)
            return
        try:
            with self._lock:
                self._place(name, staging, len(data))
        except OSError as error:
            with suppress(OSError):
                staging.unlink(missing_ok=True)
            self._failed(error)
        else:
            self._failing = False

    def _stage(self, key: str, data: bytes) -> Path:
        """`data` in a staging file of this writer's own, beside its place; removed if not whole."""
        handle, name = tempfile.mkstemp(dir=self.directory, prefix=f"{key}.", suffix=".tmp")
        staging = Path(name)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
        return staging

    def _place(self, name: str, staging: Path, size: int) -> None:
        """Rename `staging` to `name` unless another writer stored it first; then fit the budget."""
        path = self.directory / name
        if name in self._sizes and path.exists():
            staging.unlink()
            return
        self.used -= self._sizes.pop(name, 0)  # listed, but removed by another server sharing the directory
        os.replace(staging, path)  # readers see a whole file or none
        self._sizes[name] = size
        self.used += size
        while self.used > self.budget and self._sizes:
            oldest, counted = self._sizes.popitem(last=False)
            self.used -= counted
            try:
                (self.directory / oldest).unlink(missing_ok=True)
            except OSError as error:
                log.warning("the cached result %s could not be removed (%s)", oldest, error.strerror or error)

    def _failed(self, error: OSError) -> None:
        if not self._failing:  # once per run of failures: a full disk fails every write
            log.warning(
                "the result cache cannot write to %s (%s): results are answered and kept in memory, not on "
                "disk, until it can be written again; free space there, or set `cache.disk_bytes` below its space",
                self.directory,
                error.strerror or error,
            )
        self._failing = True


def _listing(directory: Path, pattern: str) -> list[tuple[Path, os.stat_result]]:
    """The files matching `pattern` with their status; one removed meanwhile is left out."""
    found = []
    for path in directory.glob(pattern):
        try:
            found.append((path, path.stat()))
        except FileNotFoundError:
            continue
    return found


def _remove_leftovers(directory: Path) -> None:
    """Remove the staging files of writes that died (a crash), old enough that no running writer
    (another server sharing the directory) still owns them."""
    for path, status in _listing(directory, "*.tmp"):
        if time.time() - status.st_mtime > _STALE_STAGING:
            log.info("removing %s, left by a cache write that did not finish", path)
            with suppress(OSError):  # one that cannot be removed costs disk space, not the start
                path.unlink(missing_ok=True)


def _encode(value: Entry) -> dict[str, np.ndarray]:
    result, meta = value.result, dict[str, Any](tokens=value.tokens)
    arrays: dict[str, np.ndarray] = {}
    if isinstance(result, Embedding):
        meta["type"] = "embedding"
        for name, array in (("dense", result.dense), ("multivector", result.multivector)):
            if array is not None:
                arrays[name] = array
        if result.sparse is not None:
            arrays["indices"], arrays["values"] = result.sparse.indices, result.sparse.values
            meta["sparse_tokens"] = result.sparse.tokens
    elif isinstance(result, Labels):
        meta |= {"type": "labels", "names": result.names}
        arrays["logits"] = result.logits
    else:
        meta |= {"type": "score", "numpy": [isinstance(v, np.generic) for v in (result.value, result.logit)]}
        arrays["value"] = np.asarray(result.value)
        if result.logit is not None:
            arrays["logit"] = np.asarray(result.logit)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def _decode(stored: dict[str, np.ndarray]) -> Entry:
    meta = json.loads(stored.pop("meta").tobytes())
    result: Result
    if meta["type"] == "embedding":
        sparse = None
        if "indices" in stored:
            tokens = meta.get("sparse_tokens")
            sparse = SparseVector(stored["indices"], stored["values"], None if tokens is None else tuple(tokens))
        result = Embedding(stored.get("dense"), sparse, stored.get("multivector"))
    elif meta["type"] == "labels":
        result = Labels(stored["logits"], tuple(meta["names"]))
    else:
        value, logit = (
            _scalar(stored.get(n), numpy) for n, numpy in zip(("value", "logit"), meta["numpy"], strict=True)
        )
        assert value is not None
        result = Score(value, logit)
    return entry(result, int(meta["tokens"]))


def _scalar(array: np.ndarray | None, numpy: bool) -> Any:
    """A stored score as the type it had: a numpy scalar or a Python float."""
    return None if array is None else array[()] if numpy else array.item()


# ---- the cache -------------------------------------------------------------------------------


class ResultCache:
    """One model's cache: `run(items, compute)` answers what it holds and computes the rest once."""

    def __init__(self, model: str, spec: ModelSpec, memory: Memory, disk: Disk | None) -> None:
        self.model, self.spec, self.memory, self.disk = model, spec, memory, disk
        self._pending: dict[str, asyncio.Future[Entry | None]] = {}
        self._identity: tuple[weakref.ref[object], str] | None = None

    async def identity(self, adapter: Adapter) -> str:
        """The loaded model's identity, hashed once per load (off the event loop: it reads the weights)."""
        if self._identity is None or self._identity[0]() is not adapter:
            hashed = await asyncio.to_thread(model_identity, self.spec, adapter)
            self._identity = (weakref.ref(adapter), hashed)
        return self._identity[1]

    async def run(self, identity: str, items: Sequence[Item], compute: Compute) -> Results:
        keys = [item_key(identity, item) for item in items]
        found = await self._found(keys)
        waiting = {k: self._pending[k] for k in dict.fromkeys(keys) if k not in found and k in self._pending}
        mine = {k: item for k, item in zip(keys, items, strict=True) if k not in found and k not in waiting}
        hits = len(found) + len(waiting)
        if mine:
            found |= await self._compute(mine, compute)
        for key, future in waiting.items():
            computed = await asyncio.shield(future)
            found[key] = (
                computed if computed is not None else (await self._compute({key: items[keys.index(key)]}, compute))[key]
            )
        record = _lookups.get()
        if record is not None:
            record.append(Lookup(self.model, hits, len(mine)))
        # a copy per position: the entries are the cache's, shared with waiters, and keys repeat
        return Results(tuple(copied_result(found[k].result) for k in keys), sum(found[k].tokens for k in keys))

    async def _found(self, keys: Sequence[str]) -> dict[str, Entry]:
        found = {k: e for k in dict.fromkeys(keys) if (e := self.memory.get(k)) is not None}
        if self.disk is not None:
            wanted = [k for k in dict.fromkeys(keys) if k not in found and k not in self._pending]
            disk = self.disk
            read = await asyncio.to_thread(lambda: {k: e for k in wanted if (e := disk.get(k)) is not None})
            for key, value in read.items():
                self.memory.put(key, value)
            found |= read
        return found

    async def _compute(self, mine: dict[str, Item], compute: Compute) -> dict[str, Entry]:
        """Compute `mine` (each key once), other requests waiting on them meanwhile."""
        loop = asyncio.get_running_loop()
        futures = {k: self._pending.setdefault(k, loop.create_future()) for k in mine}
        done: dict[str, Entry] = {}
        try:
            results = await compute(list(mine.values()))
            per_item = results.item_tokens or (0,) * len(mine)
            for key, result, tokens in zip(mine, results.items, per_item, strict=True):
                done[key] = entry(result, tokens)
            await self._store(done)
            return done
        finally:
            for key, future in futures.items():
                if self._pending.get(key) is future:
                    del self._pending[key]
                if not future.done():
                    future.set_result(done.get(key))  # None: the waiter computes it itself

    async def _store(self, done: dict[str, Entry]) -> None:
        for key, value in done.items():
            self.memory.put(key, value)
        if self.disk is not None:
            disk = self.disk
            await asyncio.to_thread(disk.put_all, done)


def caches_for(models: Sequence[ModelSpec]) -> dict[str, ResultCache]:
    """A cache per model whose entry has `cache:`; models naming one directory share its files."""
    disks: dict[Path, Disk] = {}
    caches = {}
    for spec in models:
        settings: CacheSpec | None = spec.cache
        if settings is None:
            continue
        disk = None
        if settings.disk is not None:
            place = Path(settings.disk).expanduser().resolve()
            disk = disks.setdefault(place, Disk(place, parse_budget(settings.disk_bytes, total=1)))
        caches[spec.name] = ResultCache(spec.name, spec, Memory(parse_budget(settings.memory_bytes, total=1)), disk)
    return caches
