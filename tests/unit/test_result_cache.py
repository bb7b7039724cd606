"""The result cache: keys, the LRU byte budget, the disk format, in-flight dedupe by forward count."""

from __future__ import annotations

import asyncio
import os
import time
import timeit
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import ConfigError, Registry
from model_registry.adapters.fake import FakeAdapter, fake_vector
from model_registry.cache import keys as cache_keys
from model_registry.cache.keys import item_key, model_identity
from model_registry.cache.results import Disk, Entry, Memory, entry, outcome, recording
from model_registry.config import ModelSpec
from model_registry.types import (
    Embedding,
    EmbedItem,
    Labels,
    Media,
    Mixed,
    Modality,
    Output,
    Score,
    SparseVector,
    Text,
    TokenIds,
)
from tests.unit.test_registry import forward_started, traffic_only


def cached_fake(name: str = "fake", cache: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    entry = {"name": name, "source": "fake", "kind": "fake", "pin": True, "options": options}
    return {**entry, "cache": cache if cache is not None else {"bytes": "1MiB"}}


def test_a_key_changes_with_every_option_that_changes_the_result() -> None:
    base = EmbedItem(Text("a text"))
    variants = [
        EmbedItem(Text("a text "), base.outputs),
        EmbedItem(Text("a text"), frozenset({Output.SPARSE})),
        EmbedItem(Text("a text"), prompt="query: "),
        EmbedItem(Text("a text"), is_query=True),
        EmbedItem(Text("a text"), truncate=False),
        EmbedItem(Text("a text"), truncate_left=True),
        EmbedItem(Text("a text"), max_tokens=4),
    ]
    keys = {item_key("model", item) for item in [base, *variants]}
    assert len(keys) == len(variants) + 1
    assert item_key("model", base) == item_key("model", EmbedItem(Text("a text")))
    assert item_key("other model", base) != item_key("model", base)


def test_media_is_keyed_by_its_bytes_not_by_where_it_came_from() -> None:
    def image(data: bytes, source: str) -> EmbedItem:
        return EmbedItem(Media(Modality.IMAGE, data, source))

    assert item_key("m", image(b"\x89PNG1", "https://a/x.png")) == item_key("m", image(b"\x89PNG1", "data:"))
    assert item_key("m", image(b"\x89PNG1", "x")) != item_key("m", image(b"\x89PNG2", "x"))


def test_a_mixed_input_is_keyed_by_its_text_and_its_image_bytes() -> None:
    def mixed(text: str, data: bytes, source: str = "x") -> EmbedItem:
        return EmbedItem(Mixed(text, Media(Modality.IMAGE, data, source)))

    base = mixed("a cat", b"\x89PNG1")
    variants = [
        mixed("a cat ", b"\x89PNG1"),
        mixed("a cat", b"\x89PNG2"),
        EmbedItem(Text("a cat")),
        EmbedItem(Media(Modality.IMAGE, b"\x89PNG1", "x")),
        # The text's characters moved into the image's bytes: still a different item.
        mixed("a ca", b"t\x89PNG1"),
    ]
    keys = {item_key("m", item) for item in [base, *variants]}
    assert len(keys) == len(variants) + 1
    assert item_key("m", base) == item_key("m", mixed("a cat", b"\x89PNG1", "https://a/x.png"))


def test_the_identity_follows_the_settings_that_change_results_not_the_name() -> None:
    def identity(**changes: Any) -> str:
        spec = ModelSpec.model_validate({"name": "a", "source": "fake", "kind": "fake", **changes})
        return model_identity(spec, FakeAdapter({}))

    assert identity() == identity(name="b", pin=True, cache={"bytes": 1000})
    assert identity() != identity(options={"dimensions": 16})
    assert identity() != identity(pooling="mean")


def test_the_memory_never_holds_more_than_its_budget_and_drops_the_least_recently_used() -> None:
    def vector(i: int) -> Entry:
        return entry(Embedding(dense=np.full(256, i, dtype=np.float32)), i)

    size = vector(0).size
    memory = Memory(budget=3 * size)
    for i in range(3):
        memory.put(str(i), vector(i))
    assert memory.get("0") is not None  # used now: "1" is the least recently used
    memory.put("3", vector(3))
    assert memory.get("1") is None
    assert all(memory.get(k) is not None for k in ("0", "2", "3"))
    for i in range(4, 60):
        memory.put(str(i), vector(i))
        assert memory.used <= 3 * size
    assert len(memory) == 3
    memory.put("huge", entry(Embedding(dense=np.zeros(16 * 256, dtype=np.float32)), 1))
    assert memory.get("huge") is None
    assert memory.used <= 3 * size


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, Embedding | SparseVector | Labels | Score) and type(a) is type(b):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__slots__)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(
    "result",
    [
        Embedding(dense=(np.arange(5) / 7).astype(np.float32)),
        Embedding(
            sparse=SparseVector(np.array([3, 9], dtype=np.int64), np.array([0.5, 0.25], np.float32), ("a", "b")),
            multivector=np.ones((3, 4), dtype=np.float16),
        ),
        Labels(np.array([0.1, -2.0]), ("yes", "no")),
        Score(0.3),
        Score(0.7, 0.85),
    ],
)
def test_the_disk_gives_back_exactly_what_it_was_given(tmp_path: Path, result: Any) -> None:
    disk = Disk(tmp_path / "results", budget=1 << 20)
    disk.put("k", entry(result, 7))
    found = Disk(tmp_path / "results", budget=1 << 20).get("k")  # another process's view
    assert found is not None
    assert found.tokens == 7
    assert same(found.result, result)


def test_the_disk_drops_its_oldest_files_past_its_budget(tmp_path: Path) -> None:
    disk = Disk(tmp_path, budget=5000)
    for i in range(20):
        disk.put(str(i), entry(Embedding(dense=np.zeros(200, dtype=np.float32)), 1))
        assert sum(p.stat().st_size for p in tmp_path.glob("*.npz")) <= 5000
    assert disk.get("0") is None
    assert disk.get("19") is not None


def test_the_cache_is_off_unless_configured_and_a_bad_size_names_the_key() -> None:
    assert Registry.from_config({"models": [{"name": "f", "source": "fake", "kind": "fake"}]})._caches == {}
    with pytest.raises(ConfigError, match=r"models\.0\.cache\.bytes"):
        Registry.from_config({"models": [cached_fake(cache={"bytes": "lots"})]})
    with pytest.raises(ConfigError, match="percentage"):
        Registry.from_config({"models": [cached_fake(cache={"bytes": "10%"})]})


async def test_identical_inputs_are_computed_once_within_and_across_concurrent_requests() -> None:
    async with Registry.from_config({"models": [cached_fake(delay=0.2)]}) as registry:
        adapter = traffic_only(registry, "fake")
        texts = ["one text", "two", "one text", "three"]
        with recording() as lookups:
            first = asyncio.create_task(registry.embed("fake", texts))
            await forward_started(adapter)  # its forward pass is running
            second = asyncio.create_task(registry.embed("fake", ["three", "two", "four"]))
            results = await asyncio.gather(first, second)
        assert sum(adapter.batches) == 4  # one text, two, three; then four alone
        for result, asked in zip(results, [texts, ["three", "two", "four"]], strict=True):
            for got, text in zip(result.items, asked, strict=True):
                assert isinstance(got, Embedding)
                assert got.dense is not None
                assert got.dense.tobytes() == fake_vector(text, 8).tobytes()
        assert results[0].tokens == 6
        assert results[1].tokens == 3
        assert [(x.hits, x.misses) for x in lookups] == [(0, 3), (2, 1)]
        assert outcome(lookups[:1]) == "miss"
        assert outcome(lookups) == "partial"
        again = await registry.embed("fake", ["four", "one text"])
        assert sum(adapter.batches) == 4
        assert again.tokens == 3


async def test_a_waiter_computes_the_item_itself_when_the_request_computing_it_fails() -> None:
    async with Registry.from_config({"models": [cached_fake(delay=0.2)]}) as registry:
        adapter = traffic_only(registry, "fake")
        doomed = asyncio.create_task(registry.embed("fake", ["shared text"]))
        await forward_started(adapter)
        waiter = asyncio.create_task(registry.embed("fake", ["shared text"]))
        await asyncio.sleep(0.05)
        doomed.cancel()
        result = await waiter
        item = result.items[0]
        assert isinstance(item, Embedding)
        assert item.dense is not None
        assert item.dense.tobytes() == fake_vector("shared text", 8).tobytes()
        assert len(adapter.batches) == 2


async def test_a_caller_changing_its_result_does_not_change_the_cache() -> None:
    async with Registry.from_config({"models": [cached_fake()]}) as registry:
        first = (await registry.embed("fake", ["text"])).items[0]
        assert isinstance(first, Embedding)
        assert first.dense is not None
        first.dense[:] = 0
        again = (await registry.embed("fake", ["text"])).items[0]
        assert isinstance(again, Embedding)
        assert again.dense is not None
        assert again.dense.tobytes() == fake_vector("text", 8).tobytes()


async def test_the_registry_cache_stays_inside_its_budget() -> None:
    budget = 3000
    async with Registry.from_config({"models": [cached_fake(cache={"bytes": budget}, dimensions=64)]}) as registry:
        memory = registry._caches["fake"].memory
        for i in range(40):
            await registry.embed("fake", [f"text {i}", f"other {i}"])
            assert memory.used <= budget
        assert 0 < len(memory) < 80


def test_entries_are_sized_by_their_arrays() -> None:
    small: Entry = entry(Embedding(dense=np.zeros(10, dtype=np.float32)), 1)
    large: Entry = entry(Embedding(dense=np.zeros(1000, dtype=np.float32)), 1)
    assert large.size - small.size == 990 * 4


async def test_rerank_shares_the_cache_with_embeddings() -> None:
    async with Registry.from_config({"models": [cached_fake()]}) as registry:
        adapter = traffic_only(registry, "fake")
        await registry.embed("fake", ["first document"], role="document")
        with recording() as lookups:
            ranked = await registry.rerank("fake", "a query", ["first document", "second document"])
            again = await registry.rerank("fake", "a query", ["second document", "first document"])
        assert [(x.hits, x.misses) for x in lookups] == [(1, 2), (3, 0)]
        assert sum(adapter.batches) == 3
        assert {r.document: r.score for r in ranked.results} == {r.document: r.score for r in again.results}


async def test_every_caller_gets_arrays_of_its_own_a_waiter_and_a_repeated_input_included() -> None:
    async with Registry.from_config({"models": [cached_fake(delay=0.2)]}) as registry:
        adapter = traffic_only(registry, "fake")
        owner = asyncio.create_task(registry.embed("fake", ["shared text"]))
        await forward_started(adapter)  # its forward pass is running: the next request waits on it
        waiter = asyncio.create_task(registry.embed("fake", ["shared text", "shared text"]))
        answers = [r.items for r in await asyncio.gather(owner, waiter)]
        vectors = [item.dense for items in answers for item in items if isinstance(item, Embedding)]
        assert len(vectors) == 3
        assert not np.shares_memory(vectors[1], vectors[2])  # the one input twice, as two answers
        for vector in vectors:
            assert vector is not None
            vector[:] = 0  # each caller edits what it was given
        again = (await registry.embed("fake", ["shared text"])).items[0]
        assert isinstance(again, Embedding)
        assert again.dense is not None
        assert again.dense.tobytes() == fake_vector("shared text", 8).tobytes()


def test_token_ids_and_spans_are_keyed_apart() -> None:
    def key(ids: Any, spans: Any = ()) -> str:
        return item_key("m", EmbedItem(TokenIds(ids), spans=spans))

    variants = [key((1, 2, 3)), key((1, 2, 3, 0)), key((0, 1, 2, 3)), key((3, 2, 1)), key((1, 2, 3), ((0, 2), (2, 3)))]
    variants += [key((1, 2, 3), ((0, 2), (2, 2))), key((1, 2, 3), ((0, 2),)), key((2**63,)), key((1.0, 2.0, 3.0))]
    assert len(set(variants)) == len(variants)
    assert key([1, 2, 3], [[0, 2], [2, 3]]) == key((1, 2, 3), ((0, 2), (2, 3)))
    assert key((np.int64(1), 2, 3)) == key((1, 2, 3))


def test_a_million_token_ids_are_keyed_without_stalling_the_event_loop() -> None:
    long = EmbedItem(TokenIds(tuple(range(1_000_000))))
    # keys are hashed on the event loop: fed one Python call per id, this took about 2 s
    assert min(timeit.repeat(lambda: item_key("m", long), number=1, repeat=3)) < 0.25


def weighted_model(root: Path) -> Path:
    """A sentence-transformers layout whose weights lie in subfolders, as detection/layout.py serves it."""
    for name, size in [("config.json", 8), ("0_Transformer/model.safetensors", 64), ("onnx/model.onnx.data", 64)]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(bytes(size))
    return root


def identity_of(root: Path) -> str:
    spec = ModelSpec.model_validate({"name": "m", "source": str(root), "backend": "torch"})
    return model_identity(spec, FakeAdapter({}))


@pytest.mark.parametrize("weights", ["0_Transformer/model.safetensors", "onnx/model.onnx.data"])
def test_the_identity_hashes_every_weight_file_at_any_depth_whatever_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weights: str
) -> None:
    monkeypatch.setattr(cache_keys, "_SMALL_FILE", 16)  # every file here is "large"
    root = weighted_model(tmp_path)
    before = identity_of(root)
    (root / "notes.txt").write_bytes(b"a" * 64)
    with_notes = identity_of(root)
    (root / "notes.txt").write_bytes(b"b" * 64)
    assert identity_of(root) == with_notes  # a large file that is not weights: by name and size
    (root / weights).write_bytes(b"\x01" * 64)  # retrained weights of the same size
    assert len({before, with_notes, identity_of(root)}) == 3


def test_a_reload_reads_no_weights_again_but_a_file_rewritten_in_place_is_read_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    real_read = cache_keys._read_digest

    def counted(path: Path) -> bytes:
        read.append(path.name)
        return real_read(path)

    monkeypatch.setattr(cache_keys, "_digests", OrderedDict())
    monkeypatch.setattr(cache_keys, "_read_digest", counted)
    root = weighted_model(tmp_path)
    first = identity_of(root)
    assert identity_of(root) == first
    assert sorted(read) == ["config.json", "model.onnx.data", "model.safetensors"]
    weights = root / "0_Transformer" / "model.safetensors"
    status = weights.stat()
    time.sleep(0.02)  # past the file system's clock tick, so that the rewrite has a ctime of its own
    weights.write_bytes(b"\x01" * 64)
    os.utime(weights, ns=(status.st_atime_ns, status.st_mtime_ns))  # as `cp -p` leaves it
    assert identity_of(root) != first
    monkeypatch.setattr(cache_keys, "_DIGESTS_HELD", 2)
    cache_keys._digests.clear()
    identity_of(root)  # three files read, two remembered: the memo is bounded
    assert len(cache_keys._digests) == 2


def test_the_identity_hashes_each_adapters_files_not_where_they_are(tmp_path: Path) -> None:
    root = weighted_model(tmp_path / "model")

    def adapter_dir(where: Path, weights: bytes) -> Path:
        where.mkdir(parents=True)
        (where / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        (where / "adapter_model.safetensors").write_bytes(weights)
        return where

    def identity(**adapters: Path) -> str:
        listed = {k: str(v) for k, v in adapters.items()} or None
        spec = ModelSpec(name="m", source=str(root), adapters=listed)
        return model_identity(spec, FakeAdapter({}))

    first, moved = adapter_dir(tmp_path / "a", b"\x01" * 32), adapter_dir(tmp_path / "b", b"\x01" * 32)
    assert identity(legal=first) == identity(legal=moved)  # the same files elsewhere
    assert identity(legal=first) != identity(medical=first)  # another name a request chooses by
    before = identity(legal=first)
    (first / "adapter_model.safetensors").write_bytes(b"\x02" * 32)  # retrained, same size
    assert identity(legal=first) != before
    assert identity() not in (before, identity(legal=first))
