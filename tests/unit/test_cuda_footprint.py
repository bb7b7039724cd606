"""What a model on a CUDA device is charged: torch's peak, and what its engine took outside torch.

ONNX Runtime and CTranslate2 allocate CUDA memory through their own arenas, which torch's
allocator figures never see. These tests give `load_and_measure` a device whose readings are
written down here (torch's CUDA functions replaced, a real tiny model running on the CPU), so the
arithmetic and its wiring are checked without a GPU; `tests/engines/test_gpu.py` checks the real
engines on one.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import pytest

from model_registry.adapters import Adapter, LoadOptions, create_adapter
from model_registry.backends.devices import gate
from model_registry.config import ModelSpec
from model_registry.errors import ModelUnavailable
from model_registry.runtime.memory import CudaReading, cuda_footprint, load_and_measure
from tests.builders.text import tiny_bert

torch = pytest.importorskip("torch")

MIB = 1 << 20
TOTAL = 16 << 30


@pytest.mark.parametrize(
    ("before", "after", "peak", "expected"),
    [
        # torch alone: its peak of live tensors; the growth of its reserve is not counted again.
        ((0, 0, 500), (40, 64, 564), 90, 90),
        # an engine arena: nothing in torch, 300 MiB gone from the device.
        ((0, 0, 500), (0, 0, 800), 0, 300),
        # both, with other models' tensors already on the device.
        ((100, 128, 700), (110, 160, 1_082), 125, 25 + 350),
        # another process freed memory meanwhile: the load is never charged less than torch's part.
        ((0, 0, 900), (40, 64, 700), 90, 90),
    ],
)
def test_cuda_footprint_adds_what_the_device_lost_outside_torch(
    before: tuple[int, int, int], after: tuple[int, int, int], peak: int, expected: int
) -> None:
    reading = lambda values: CudaReading(*(v * MIB for v in values))  # noqa: E731
    assert cuda_footprint(reading(before), reading(after), peak * MIB) == expected * MIB


class FakeDevice:
    """One CUDA device's readings, moved by the test's adapter as a real engine would move them."""

    def __init__(self) -> None:
        self.used, self.allocated, self.reserved, self.peak = 700 * MIB, 100 * MIB, 128 * MIB, 100 * MIB

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (TOTAL - self.used, TOTAL))
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.allocated))


@pytest.fixture
def adapter(tmp_path: Path) -> Adapter:
    return create_adapter(ModelSpec(name="m", source=str(tiny_bert(tmp_path / "bert"))))


OPTIONS = LoadOptions(device="cpu", dtype="float32", max_batch_tokens=64)


def test_a_cuda_load_is_charged_the_arena_its_engine_keeps_outside_torch(
    adapter: Adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = FakeDevice()
    device.install(monkeypatch)
    load, forward = adapter.load, adapter.forward

    def loading(options: LoadOptions) -> None:
        load(options)
        device.used += 300 * MIB  # the engine's weights and arena
        device.allocated += 10 * MIB  # a few tensors in torch (its reserve grows by 32 MiB)
        device.reserved += 32 * MIB
        device.used += 32 * MIB

    def forwarding(batch: Any) -> Any:
        device.used += 40 * MIB  # the arena grows to the worst-case batch, and keeps it
        device.peak = max(device.peak, device.allocated + 5 * MIB)
        return forward(batch)

    monkeypatch.setattr(adapter, "load", loading)
    monkeypatch.setattr(adapter, "forward", forwarding)
    try:
        measured = load_and_measure(adapter, OPTIONS, "cuda:0")
    finally:
        adapter.unload()
    warmups = (device.used - 700 * MIB - 332 * MIB) // (40 * MIB)
    assert warmups >= 1
    assert measured == (10 + 5) * MIB + (300 + 40 * warmups) * MIB


@pytest.mark.parametrize(
    "message",
    [
        "CUDA failed with error out of memory",
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer of size 1024",
    ],
)
def test_an_engine_out_of_memory_on_the_warm_up_is_a_clear_load_error(
    adapter: Adapter, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    FakeDevice().install(monkeypatch)
    unloaded: list[bool] = []
    unload = adapter.unload

    def failing(batch: Any) -> Any:
        raise RuntimeError(message)

    def unloading() -> None:
        unloaded.append(True)
        unload()

    monkeypatch.setattr(adapter, "forward", failing)
    monkeypatch.setattr(adapter, "unload", unloading)
    with pytest.raises(ModelUnavailable, match="ran out of cuda:0 memory on a worst-case batch of 64 tokens"):
        load_and_measure(adapter, OPTIONS, "cuda:0")
    assert unloaded == [True]


def test_another_failure_on_the_warm_up_is_not_called_out_of_memory(
    adapter: Adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeDevice().install(monkeypatch)

    def failing(batch: Any) -> Any:
        raise RuntimeError("shape mismatch in layer 3")

    monkeypatch.setattr(adapter, "forward", failing)
    try:
        with pytest.raises(RuntimeError, match="shape mismatch"):
            load_and_measure(adapter, OPTIONS, "cuda:0")
    finally:
        adapter.unload()


def other_batch_runs(device: str, within: float) -> bool:
    """Whether a batch of another model on `device` gets through its gate within `within` seconds."""
    passed = threading.Event()

    def batch() -> None:
        with gate(device).shared():
            passed.set()

    threading.Thread(target=batch, daemon=True).start()
    return passed.wait(within)


def test_the_gate_is_held_while_the_load_measures_never_while_the_artifact_is_built(
    adapter: Adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeDevice().install(monkeypatch)
    seen: dict[str, bool] = {}
    load = adapter.load

    def building(options: LoadOptions) -> None:
        seen["batch ran during the build"] = other_batch_runs("cuda:0", within=5.0)

    def loading(options: LoadOptions) -> None:
        seen["batch ran during the load"] = other_batch_runs("cuda:0", within=0.3)
        load(options)

    monkeypatch.setattr(adapter, "build", building)
    monkeypatch.setattr(adapter, "load", loading)
    try:
        load_and_measure(adapter, OPTIONS, "cuda:0")
    finally:
        adapter.unload()
    assert seen == {"batch ran during the build": True, "batch ran during the load": False}


@pytest.mark.parametrize(
    ("backend", "module", "step"),
    [
        ("ctranslate2", "model_registry.backends.ctranslate2.engine", "convert"),
        pytest.param("onnx", "model_registry.backends.onnx.build", "build_artifact", marks=pytest.mark.slow),
    ],
)
def test_a_conversion_runs_outside_the_devices_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: Any, module: str, step: str
) -> None:
    pytest.importorskip(backend)
    target = importlib.import_module(module)
    FakeDevice().install(monkeypatch)
    converting: list[bool] = []
    real = getattr(target, step)

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        converting.append(other_batch_runs("cuda:0", within=5.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, step, instrumented)
    spec = ModelSpec(name="m", source=str(tiny_bert(tmp_path / "bert")), backend=backend)
    adapter = create_adapter(spec)
    cache = str(tmp_path / "cache")
    options = LoadOptions(device="cpu", dtype="float32", max_batch_tokens=64, backend=backend, cache_dir=cache)
    try:
        load_and_measure(adapter, options, "cuda:0")
        assert adapter.describe()["engine"]["backend"] == backend
    finally:
        adapter.unload()
    assert converting == [True], "the conversion ran while the device's gate was held (or ran twice)"
