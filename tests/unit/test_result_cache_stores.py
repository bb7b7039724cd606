"""The result cache's stores: the memory's charge against what it really holds, the disk's byte
count under concurrent writers and files removed behind its back, and disk write errors."""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import Registry
from model_registry.adapters.fake import fake_vector
from model_registry.cache import results as result_cache
from model_registry.cache.results import Disk, Entry, Memory, entry
from model_registry.types import Embedding, Labels, Score, SparseVector
from tests.unit.test_result_cache import cached_fake

ENTRIES: dict[str, Callable[[int], Entry]] = {
    "score": lambda i: entry(Score(np.float64(0.5), np.float64(0.1)), 1000 + i),
    "labels": lambda i: entry(Labels(np.zeros(3, np.float32), tuple(f"label {j}-{i}" for j in range(3))), 10),
    "sparse with tokens": lambda i: entry(
        Embedding(sparse=SparseVector(np.arange(30), np.ones(30, np.float32), tuple(f"t{j}-{i}" for j in range(30)))),
        30,
    ),
    "dense 384": lambda i: entry(Embedding(dense=np.zeros(384, np.float32)), 10),
}


def fill(memory: Memory, make: Callable[[int], Entry], count: int) -> int:
    """Bytes the process holds after `count` entries were put, as tracemalloc measures them."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            memory.put(hashlib.sha256(str(i).encode()).hexdigest(), make(i))
        gc.collect()  # garbage the collector had not reached yet is not the store's
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", list(ENTRIES))
def test_the_memory_really_held_never_exceeds_the_budget(kind: str) -> None:
    make = ENTRIES[kind]
    fill(Memory(budget=1 << 30), make, 200)  # one-off allocations (numpy's, the interpreter's) are not the store's
    # 1367 entries: the LRU's table resizes to 8192 slots, six per entry, the most it ever has
    memory = Memory(budget=1367 * make(3 * 1367).size)  # the size of the entries that stay
    held = fill(memory, make, 3 * 1367)
    assert len(memory) == 1367
    assert held <= memory.budget


def real_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.npz"))


def vector(i: int) -> Entry:
    return entry(Embedding(dense=np.full(64, i, dtype=np.float32)), 1)


def test_writers_of_the_same_keys_count_each_file_once(tmp_path: Path) -> None:
    disk = Disk(tmp_path, budget=1 << 30)
    start = threading.Barrier(4)

    def write() -> None:
        start.wait()
        for i in range(40):
            disk.put(str(i), vector(i))

    writers = [threading.Thread(target=write) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert len(list(tmp_path.glob("*.npz"))) == 40
    assert disk.used == real_bytes(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))


def test_files_removed_behind_the_store_s_back_do_not_make_it_drop_every_new_file(tmp_path: Path) -> None:
    disk = Disk(tmp_path, budget=20_000)
    for round_ in range(30):
        for i in range(10):
            disk.put(f"{round_}-{i}", vector(i))
        for path in sorted(tmp_path.glob("*.npz"))[::3]:
            path.unlink()  # another server sharing the directory dropped them
    disk.put("last", vector(1))
    assert disk.get("last") is not None
    (tmp_path / "last.npz").unlink()
    disk.put("last", vector(1))  # stored again, and counted once
    assert disk.get("last") is not None
    assert real_bytes(tmp_path) <= disk.used <= disk.budget


class FullDisk:
    """`tempfile` for the store, its staging files all on a full disk (writes to /dev/full fail
    with ENOSPC)."""

    @staticmethod
    def mkstemp(dir: Path, prefix: str, suffix: str) -> tuple[int, str]:
        name = Path(dir) / f"{prefix}full{suffix}"
        name.touch()
        return os.open("/dev/full", os.O_WRONLY), str(name)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
async def test_a_full_disk_is_logged_once_and_every_request_is_still_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "results"
    config: dict[str, Any] = {"models": [cached_fake(cache={"bytes": "1MiB", "disk": str(store)})]}
    async with Registry.from_config(config) as registry:
        monkeypatch.setattr(result_cache, "tempfile", FullDisk)
        with caplog.at_level(logging.WARNING, logger="model_registry.cache.results"):
            for text in ("first", "second"):
                found = (await registry.embed("fake", [text])).items[0]
                assert isinstance(found, Embedding)
                assert found.dense is not None
                assert found.dense.tobytes() == fake_vector(text, 8).tobytes()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "No space left on device" in warnings[0]
        assert not list(store.iterdir())  # the staging files went with their failed writes
        monkeypatch.undo()
        await registry.embed("fake", ["third"])
        assert len(list(store.glob("*.npz"))) == 1
        assert registry._caches["fake"].disk is not None
        assert registry._caches["fake"].disk.used == real_bytes(store)


def test_staging_files_left_by_a_crash_are_removed_when_the_store_starts(tmp_path: Path) -> None:
    left, writing = tmp_path / "a1b2.x7k2.tmp", tmp_path / "c3d4.p9q1.tmp"
    left.write_bytes(b"half a file")
    writing.write_bytes(b"another server's write in progress")
    an_hour_ago = time.time() - 3600
    os.utime(left, (an_hour_ago, an_hour_ago))
    Disk(tmp_path, budget=1 << 20)
    assert not left.exists()
    assert writing.exists()
