"""A content-addressed cache of model results, per model, off unless its entry has `cache:`.

An item's key hashes the model's identity (the contents of its files, the engine, precision,
device and every setting that changes what it computes) with the item itself: its text, token ids
or media bytes and the options that change its result (outputs, prompt, truncation, token limit).
Options applied after the model (`dimensions`, encodings) are not part of it. Results live in
memory under an LRU byte budget and optionally on disk (`disk:`, its own byte budget), where any
model whose identity is the same finds them.

Identical items inside one request are computed once; an item another request is computing is
waited for, not computed again (if that request fails or is cancelled, the waiter computes it).
Each `run` records how many of its distinct items were found and how many computed, read at the
edge with `recording()` (the `X-Cache` header and the hit ratio in `/metrics`).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import io
import json
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.backends.cache import artifact_key, model_files
from model_registry.config import CacheSpec, ModelSpec, parse_budget
from model_registry.errors import ModelUnavailable
from model_registry.sources import resolve_source
from model_registry.types import Embedding, Item, Labels, Result, Results, Score, SparseVector

log = logging.getLogger(__name__)

#: Model settings that change nothing a result holds (scheduling, memory, naming).
_OPERATIONAL = frozenset({"name", "pin", "keep_alive", "max_queued_items", "max_batch_tokens", "cache", "truncate"})
#: Fields of an item that do not change its result (where a media input was fetched from).
_NOT_RESULT = frozenset({("Media", "source")})
#: Files above this size that are not weights are keyed by name and size, not by contents.
_SMALL_FILE = 64 << 20
#: What an entry costs beyond its arrays (its key, records, the LRU's links).
_OVERHEAD = 256

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


# ---- keys ----------------------------------------------------------------------------------------


def model_identity(spec: ModelSpec, adapter: Adapter) -> str:
    """Hash of the model's files (as the engine artifacts' keys hash them, plus every other small
    file: tokenizer, heads, pooling) and the settings that change its results."""
    settings = spec.model_dump(mode="json", exclude=set(_OPERATIONAL))
    settings["engine"] = adapter.backend
    settings["loaded_dtype"] = str(spec.dtype if adapter.dtype is None else adapter.dtype)
    settings["loaded_device"] = adapter.device or spec.device
    try:
        directory = resolve_source(spec.source, revision=spec.revision)
    except ModelUnavailable:  # a model without files (the fake one): its settings are all it is
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    del settings["source"], settings["revision"]  # the files say what the model is, wherever they are
    digest = hashlib.sha256(artifact_key(directory, {}, settings).encode())
    weights = set(model_files(directory))
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p not in weights):
        relative = path.relative_to(directory)
        if relative.parts[0].startswith("."):
            continue
        size = path.stat().st_size
        digest.update(f"{relative}:{size}".encode())
        if size <= _SMALL_FILE:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def item_key(identity: str, item: Item) -> str:
    digest = hashlib.sha256(identity.encode())
    _feed(digest, item)
    return digest.hexdigest()


def _feed(digest: Any, value: object) -> None:
    """Every field of `value`, each with its type and length, so that no two items collide."""
    if is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        digest.update(f"<{name}>".encode())
        for field in fields(value):
            if (name, field.name) not in _NOT_RESULT:
                _feed(digest, getattr(value, field.name))
    elif isinstance(value, bytes | str):
        data = value.encode() if isinstance(value, str) else value
        digest.update(f"{type(value).__name__}{len(data)}:".encode())
        digest.update(data)
    elif isinstance(value, frozenset | set):
        digest.update(f"set{len(value)}:".encode())
        for member in sorted(value, key=repr):
            _feed(digest, member)
    elif isinstance(value, tuple | list):
        digest.update(f"seq{len(value)}:".encode())
        for member in value:
            _feed(digest, member)
    elif value is None or isinstance(value, bool | int | float | enum.Enum):
        digest.update(f"{value!r};".encode())
    else:
        raise TypeError(f"This is a bug: an item holds a {type(value).__name__}, which the cache cannot key")


# ---- entries ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    result: Result
    tokens: int
    size: int


def _arrays(result: Result) -> list[np.ndarray]:
    if isinstance(result, Embedding):
        sparse = (result.sparse.indices, result.sparse.values) if result.sparse is not None else (None, None)
        return [a for a in (result.dense, result.multivector, *sparse) if isinstance(a, np.ndarray)]
    return [result.logits] if isinstance(result, Labels) else []


def entry(result: Result, tokens: int) -> Entry:
    """A private copy of `result`: what a caller does to its own arrays never reaches the cache."""
    copied: Result = result
    if isinstance(result, Embedding):
        sparse = result.sparse
        copied = Embedding(
            None if result.dense is None else result.dense.copy(),
            None if sparse is None else SparseVector(sparse.indices.copy(), sparse.values.copy(), sparse.tokens),
            None if result.multivector is None else result.multivector.copy(),
        )
    elif isinstance(result, Labels):
        copied = Labels(result.logits.copy(), result.names)
    size = sum(a.nbytes for a in _arrays(copied)) + _OVERHEAD
    if isinstance(result, Embedding) and result.sparse is not None and result.sparse.tokens:
        size += sum(len(t) + 50 for t in result.sparse.tokens)
    if isinstance(result, Labels):
        size += sum(len(n) + 50 for n in result.names)
    return Entry(copied, tokens, size)


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
    their sizes pass `budget`; shared by every cached model that names the same directory."""

    def __init__(self, directory: Path, budget: int) -> None:
        self.directory, self.budget = directory, budget
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._files = sorted(directory.glob("*.npz"), key=lambda p: p.stat().st_mtime)
        self._lock = threading.Lock()  # puts come from several models' threads
        self.used = sum(p.stat().st_size for p in self._files)

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
        path = self.directory / f"{key}.npz"
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **_encode(value))
        data = buffer.getvalue()
        if len(data) > self.budget or path.exists():
            return
        with self._lock:
            self._write(path, data)

    def _write(self, path: Path, data: bytes) -> None:
        staging = path.with_suffix(f".{os.getpid()}.tmp")
        staging.write_bytes(data)
        os.replace(staging, path)  # readers see a whole file or none
        self._files.append(path)
        self.used += len(data)
        while self.used > self.budget and self._files:
            oldest = self._files.pop(0)
            try:
                self.used -= oldest.stat().st_size
                oldest.unlink()
            except OSError:
                continue


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
        return Results(tuple(found[k].result for k in keys), sum(found[k].tokens for k in keys))

    async def _found(self, keys: Sequence[str]) -> dict[str, Entry]:
        found = {k: e for k in dict.fromkeys(keys) if (e := self.memory.get(k)) is not None}
        if self.disk is not None:
            wanted = [k for k in dict.fromkeys(keys) if k not in found and k not in self._pending]
            disk = self.disk
            read = await asyncio.to_thread(lambda: {k: e for k in wanted if (e := disk.get(k)) is not None})
            for key, value in read.items():
                self.memory.put(key, value)
            found |= read
        return {k: entry(e.result, e.tokens) for k, e in found.items()}

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
            return {k: entry(e.result, e.tokens) for k, e in done.items()}
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
