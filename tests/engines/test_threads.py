"""One compute pool per device: two models called at once take turns on the CPU instead of
oversubscribing it, and while one holds the CPU, ONNX Runtime and CTranslate2 cut a batch of
several rows into lanes run at once. A model on those engines with small heads runs its torch
work on its forward thread alone."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.backends.threads import cores, row_ranges, run_in_lanes
from tests.builders.text import tiny_bert
from tests.engines.families import FAMILIES
from tests.engines.helpers import TEXTS

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")

Span = tuple[float, float, str, int]


class Recorder:
    """Wraps a callable and records (start, end, tag, rows) of every call."""

    def __init__(self, inner: Any, tag: str, spans: list[Span], lock: threading.Lock) -> None:
        self.inner, self.tag, self.spans, self.lock = inner, tag, spans, lock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        time.sleep(0.01)  # widen the window in which an overlap would show
        result = self.inner(*args, **kwargs)
        rows = _rows(args)
        with self.lock:
            self.spans.append((started, time.perf_counter(), self.tag, rows))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _rows(args: tuple[Any, ...]) -> int:
    """Rows of the batch a call was given: ONNX Runtime's feeds, CTranslate2's ids, torch's ids."""
    for value in args:
        if isinstance(value, dict) and "input_ids" in value:
            return int(np.asarray(value["input_ids"]).shape[0])
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) == 2:
            return int(shape[0])
    return 0


def recorded(engines: dict[str, Any], spans: list[Span]) -> None:
    """Put a `Recorder` around each engine's own forward call."""
    lock = threading.Lock()
    for tag, engine in engines.items():
        if tag == "onnx":
            session: Any = Recorder(engine.session, tag, spans, lock)
            session.run = Recorder(session.inner.run, tag, spans, lock)
            engine.session = session
        elif tag == "ctranslate2":
            encoder: Any = Recorder(engine.encoder, tag, spans, lock)
            encoder.forward_batch = Recorder(encoder.inner.forward_batch, tag, spans, lock)
            engine.encoder = encoder
        else:
            engine.model = Recorder(engine.model, tag, spans, lock)


def test_two_engines_at_once_take_turns_with_every_core(tmp_path: Path) -> None:
    from model_registry.backends.ctranslate2.engine import Ct2Engine
    from model_registry.backends.onnx.engine import OnnxEngine
    from model_registry.backends.torch.engine import TorchEngine

    directory = tiny_bert(tmp_path / "bert")
    options = EngineOptions(device="cpu", cache_dir=str(tmp_path / "cache"))
    onnx, ct2, torch_engine = OnnxEngine(), Ct2Engine(), TorchEngine()
    for engine in (onnx, ct2, torch_engine):
        engine.load(directory, options)
    assert onnx.session is not None
    assert onnx.session.get_session_options().intra_op_num_threads == cores()
    assert (onnx.lanes, ct2.lanes) == (min(2, cores()), min(2, cores()))
    spans: list[Span] = []
    recorded({"onnx": onnx, "ctranslate2": ct2, "torch": torch_engine}, spans)
    ids = np.array([[2, 10, 11, 12, 13, 14, 3]] * 8, dtype=np.int64)
    batch = EncoderBatch(ids, np.ones_like(ids))

    def hammer(engine: Any) -> None:
        for _ in range(10):
            engine.run(batch)

    threads = [threading.Thread(target=hammer, args=(e,)) for e in (onnx, ct2, torch_engine)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(spans) >= 30
    overlaps = [(a, b) for a in spans for b in spans if a[2] < b[2] and a[0] < b[1] and b[0] < a[1]]
    assert not overlaps, f"{len(overlaps)} forward passes of different models ran at the same time"


@pytest.mark.parametrize("name", ["onnx", "ctranslate2"])
def test_a_cpu_batch_runs_in_lanes_at_once_and_gives_what_one_run_gives(tmp_path: Path, name: str) -> None:
    """Three lanes (whatever the cores): a batch of 8 rows is three calls of 2, 3 and 3 rows,
    running at the same time, whose outputs put together equal one call's over the whole batch; a
    single row is one call, on the calling thread."""
    from model_registry.backends.ctranslate2.engine import Ct2Engine
    from model_registry.backends.onnx.engine import OnnxEngine

    directory = tiny_bert(tmp_path / "bert")
    engine: Any = OnnxEngine() if name == "onnx" else Ct2Engine()
    engine.load(directory, EngineOptions(device="cpu", lanes=3, cache_dir=str(tmp_path / "cache")))
    if name == "onnx":
        assert engine.session.get_session_options().intra_op_num_threads == cores()
    else:
        assert engine.encoder.num_encoders == 3
    assert engine.describe()["lanes"] == 3
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 90, size=(8, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[5:, 6:] = 0  # three shorter rows, right-padded
    ids[mask == 0] = 0
    batch = EncoderBatch(ids, mask)
    engine.lanes = 1
    whole = engine.run(batch).hidden  # the reference: the same engine, the batch in one call
    spans: list[Span] = []
    callers: list[str] = []
    recorded({name: engine}, spans)
    inner = engine.session.run if name == "onnx" else engine.encoder.forward_batch

    def noting(*args: Any, **kwargs: Any) -> Any:
        callers.append(threading.current_thread().name)
        return inner(*args, **kwargs)

    if name == "onnx":
        engine.session.run = noting
    else:
        engine.encoder.forward_batch = noting
    engine.lanes = 3
    split = engine.run(batch).hidden
    assert sorted(rows for *_, rows in spans) == [2, 3, 3]
    starts, ends = [s[0] for s in spans], [s[1] for s in spans]
    assert max(starts) < min(ends), "the lanes of one batch did not run at the same time"
    assert threading.current_thread().name in callers
    assert split.shape == whole.shape
    np.testing.assert_allclose(split[mask == 1], whole[mask == 1], atol=1e-5)
    spans.clear()
    callers.clear()
    single = engine.run(EncoderBatch(ids[:1], mask[:1])).hidden
    assert [rows for *_, rows in spans] == [1]
    assert callers == [threading.current_thread().name]
    np.testing.assert_allclose(single[0], whole[0], atol=1e-5)
    engine.release()


def test_ctranslate2_replicas_share_the_cores_out_float_ones_keeping_two_threads_where_there_are_two() -> None:
    from model_registry.backends.ctranslate2.engine import replica_threads

    assert [replica_threads(threads, 2, "float32") for threads in (1, 2, 3, 4, 16)] == [1, 2, 2, 2, 8]
    assert [replica_threads(threads, 2, "int8") for threads in (1, 2, 3, 4, 16)] == [1, 1, 1, 2, 8]
    assert replica_threads(16, 1, "float32") == replica_threads(16, 1, "int8") == 16  # one lane: every thread
    assert replica_threads(2, 3, "float32") == 2
    assert replica_threads(2, 3, "int8") == 1


@pytest.mark.parametrize(("quantize", "lane_threads"), [("none", 2), ("int8", 1)])
def test_a_ctranslate2_model_loads_its_replicas_with_the_threads_its_compute_type_gets(
    tmp_path: Path, quantize: str, lane_threads: int
) -> None:
    from model_registry.backends.ctranslate2.engine import Ct2Engine

    engine = Ct2Engine()
    options = EngineOptions(device="cpu", threads=2, lanes=2, quantize=quantize, cache_dir=str(tmp_path / "cache"))
    engine.load(tiny_bert(tmp_path / "bert"), options)
    described = engine.describe()
    assert (described["lanes"], described["lane_threads"]) == (2, lane_threads)
    assert engine.encoder.num_encoders == 2
    engine.release()


def test_row_ranges_cover_every_row_once_in_order_in_near_equal_parts() -> None:
    assert row_ranges(8, 3) == [slice(0, 2), slice(2, 5), slice(5, 8)]
    assert row_ranges(1, 4) == [slice(0, 1)]
    assert row_ranges(5, 1) == [slice(0, 5)]
    for rows in range(1, 40):
        for parts in range(1, 9):
            ranges = row_ranges(rows, parts)
            assert len(ranges) == min(rows, parts)
            covered = [i for r in ranges for i in range(r.start, r.stop)]
            assert covered == list(range(rows))
            sizes = [r.stop - r.start for r in ranges]
            assert max(sizes) - min(sizes) <= 1


def test_a_lane_that_fails_fails_the_run_after_every_lane_has_stopped() -> None:
    """No lane outlives the run (the caller's compute slot): the error comes after all of them."""
    finished: list[int] = []

    def work(rows: slice) -> np.ndarray:
        if rows.start == 0:
            raise ValueError("the first lane failed")
        time.sleep(0.2)
        start: int = rows.start
        finished.append(start)
        return np.arange(rows.start, rows.stop)

    with pytest.raises(ValueError, match="the first lane failed"):
        run_in_lanes(work, 9, 3)
    assert sorted(finished) == [3, 6]
    joined = run_in_lanes(lambda rows: np.arange(9)[rows], 9, 3)
    assert joined.tolist() == list(range(9))


def fresh_thread_count() -> int:
    """The torch threads a thread that has not used torch yet starts with."""
    import torch

    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def openmp_pool_of_two_or_more() -> int:
    import torch

    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch does not run its operators on OpenMP")
    count = fresh_thread_count()
    if count < 2:
        pytest.skip("torch has one thread here: there is nothing to confine")
    return count


def test_torch_confined_on_one_thread_leaves_every_other_thread_its_count() -> None:
    """`torch.set_num_threads(1)` would fail this: a thread that starts using torch afterwards
    would start with one thread too."""
    import torch

    from model_registry.backends.torch import engine as torch_backend

    pool = openmp_pool_of_two_or_more()
    main = torch.get_num_threads()
    seen: dict[str, int | None] = {}
    confined, done = threading.Event(), threading.Event()

    def confine_here() -> None:
        seen["before"] = torch_backend.confine(1)
        seen["confined"] = torch.get_num_threads()
        seen["sum"] = int(torch.ones(64, 4096).sum())  # an operator large enough to go parallel
        confined.set()
        done.wait(30)
        torch_backend.confine(seen["before"] or 1)
        seen["restored"] = torch.get_num_threads()

    thread = threading.Thread(target=confine_here)
    thread.start()
    assert confined.wait(30)
    seen["fresh"] = fresh_thread_count()
    seen["main"] = torch.get_num_threads()
    done.set()
    thread.join()
    assert seen == {"before": pool, "confined": 1, "sum": 64 * 4096, "fresh": pool, "main": main, "restored": pool}


def test_the_cpu_torch_thread_binds_its_pool_one_thread_to_a_core() -> None:
    """Left free, a pool thread woken after an idle spell was put on its master's core."""
    import torch

    from model_registry.backends import devices

    pool = openmp_pool_of_two_or_more()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) != pool:
        pytest.skip("torch's threads are not one per core of this process: the pool is left free")
    thread = devices.TorchThread()  # its own, not the process's: the first call binds

    def where() -> tuple[int, float]:
        return threading.get_native_id(), float(torch.ones(pool * 64, 4096).sum())

    me, total = thread.call(where)
    assert total == pool * 64 * 4096
    assert len(thread.pool) == pool - 1
    assert os.sched_getaffinity(me) == {cpus[0]}
    assert sorted(next(iter(os.sched_getaffinity(t))) for t in thread.pool) == cpus[1:pool]
    assert all(len(os.sched_getaffinity(t)) == 1 for t in thread.pool)
    assert sorted(os.sched_getaffinity(0)) == cpus, "the calling thread must stay free"


@pytest.mark.parametrize(
    ("family", "backend", "alone"),
    [("dense", "torch", False), ("dense", "onnx", True), ("dense", "ctranslate2", True), ("splade", "onnx", False)],
)
def test_a_model_with_small_heads_on_a_converting_engine_runs_torch_alone_on_its_forward_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, backend: str, alone: bool
) -> None:
    """Dense on ONNX Runtime or CTranslate2: one torch thread where the batches run (its pool's
    other threads would spin beside the engine's). On torch (the CPU's torch thread), and for
    SPLADE's vocabulary-wide head, the thread that runs the batches keeps the pool."""
    import torch

    from model_registry import Registry
    from model_registry.runtime.worker import Worker

    pool = openmp_pool_of_two_or_more()
    counts: list[int] = []
    compute = Worker._compute

    def recording(self: Worker, collated: Any) -> Any:
        counts.append(torch.get_num_threads())  # on the thread that runs the batch
        return compute(self, collated)

    monkeypatch.setattr(Worker, "_compute", recording)
    builder, kind, _, _ = FAMILIES[family]
    model = {"name": "m", "source": str(builder(tmp_path / family)), "kind": kind, "backend": backend, "device": "cpu"}
    outputs = ["sparse"] if family == "splade" else ["dense"]

    async def scenario() -> None:
        async with Registry.from_config({"models": [model], "engine_cache": str(tmp_path / "cache")}) as registry:
            for text in TEXTS:
                await registry.embed("m", [text, text + " again"], outputs=outputs)

    asyncio.run(scenario())
    assert counts == [1 if alone else pool] * len(TEXTS)


@pytest.mark.parametrize(
    ("engine", "device", "small_heads", "confined"),
    [
        ("onnx", "cpu", True, True),
        ("ctranslate2", "cpu", True, True),
        ("torch", "cpu", True, False),
        ("onnx", "cuda:0", True, False),
        ("ctranslate2", "cuda:0", True, False),
        ("onnx", "cpu", False, False),
    ],
)
def test_only_a_cpu_engine_other_than_torch_under_small_heads_confines_its_forward_thread(
    monkeypatch: pytest.MonkeyPatch, engine: str, device: str, small_heads: bool, confined: bool
) -> None:
    from types import SimpleNamespace

    from model_registry.adapters import dense
    from model_registry.backends.torch import engine as torch_backend

    calls: list[int] = []
    monkeypatch.setattr(torch_backend, "confine", calls.append)
    dense.TextEncoder.on_forward_thread(SimpleNamespace(backend=engine, device=device, small_heads=small_heads))  # type: ignore[arg-type]
    assert calls == ([1] if confined else [])
