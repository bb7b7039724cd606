"""One compute pool per device: every engine sizes its threads to the cores, and two models
called at once take turns on the CPU instead of oversubscribing it."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.backends.threads import cores
from tests.builders.text import tiny_bert

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")


class Recorder:
    """Wraps a callable and records the (start, end) of every call."""

    def __init__(self, inner: Any, spans: list[tuple[float, float]], lock: threading.Lock) -> None:
        self.inner, self.spans, self.lock = inner, spans, lock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        time.sleep(0.01)  # widen the window in which an overlap would show
        result = self.inner(*args, **kwargs)
        with self.lock:
            self.spans.append((started, time.perf_counter()))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_two_engines_at_once_take_turns_with_every_core(tmp_path: Path) -> None:
    from model_registry.backends.ctranslate2 import Ct2Engine
    from model_registry.backends.onnx import OnnxEngine
    from model_registry.backends.torch import TorchEngine

    directory = tiny_bert(tmp_path / "bert")
    options = EngineOptions(device="cpu", cache_dir=str(tmp_path / "cache"))
    onnx, ct2, torch_engine = OnnxEngine(), Ct2Engine(), TorchEngine()
    for engine in (onnx, ct2, torch_engine):
        engine.load(directory, options)
    assert onnx.session is not None
    assert onnx.session.get_session_options().intra_op_num_threads == cores()
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    session: Any = Recorder(onnx.session, spans, lock)
    session.run = Recorder(session.inner.run, spans, lock)
    onnx.session = session
    encoder: Any = Recorder(ct2.encoder, spans, lock)
    encoder.forward_batch = Recorder(encoder.inner.forward_batch, spans, lock)
    ct2.encoder = encoder
    torch_engine.model = Recorder(torch_engine.model, spans, lock)
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
    spans.sort()
    assert len(spans) >= 30
    overlaps = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert not overlaps, f"{len(overlaps)} forward passes of different models ran at the same time"
