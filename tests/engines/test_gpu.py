"""The CUDA paths: ONNX Runtime's CUDA provider in float16 with IO binding, CTranslate2 in
float16 and int8_float16. Skipped without a CUDA device (and the onnx-gpu extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry.adapters import LoadOptions, create_adapter
from model_registry.config import ModelSpec
from model_registry.memory import CudaReading, load_and_measure, release, weight_bytes
from tests.builders.text import tiny_bert
from tests.engines.helpers import embed_items, load, max_difference, run

pytestmark = pytest.mark.gpu

#: float16 arithmetic against the float32 torch reference, on unit-length vectors.
HALF_TOLERANCE = 5e-3


def cuda_for(backend: str) -> None:
    if backend == "onnx":
        ort = pytest.importorskip("onnxruntime")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip("onnxruntime has no CUDA provider here (install the onnx-gpu extra on a GPU machine)")
    else:
        ct2 = pytest.importorskip("ctranslate2")
        if ct2.get_cuda_device_count() == 0:
            pytest.skip("CTranslate2 sees no CUDA device")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert") / "bert")


@pytest.mark.parametrize(
    ("backend", "dtype"), [("onnx", "float16"), ("ctranslate2", "float16"), ("ctranslate2", "int8_float16")]
)
def test_cuda_engines_match_torch_in_half_precision(bert: Path, tmp_path: Path, backend: str, dtype: str) -> None:
    cuda_for(backend)
    reference = run(load(bert, "torch", tmp_path, device="cpu"), embed_items())
    adapter = load(bert, backend, tmp_path, device="cuda", dtype=dtype)
    assert str(getattr(adapter, "device", "")).startswith("cuda")
    batched = run(adapter, embed_items())
    tolerance = HALF_TOLERANCE if dtype == "float16" else 5e-2
    assert max_difference(batched, reference) <= tolerance
    single = [run(adapter, [item])[0] for item in embed_items()]
    assert max_difference(single, batched) <= tolerance
    adapter.unload()


@pytest.mark.parametrize(("backend", "dtype"), [("onnx", "float16"), ("ctranslate2", "float16")])
def test_cuda_engines_are_charged_the_device_memory_they_take_and_give_it_back(
    bert: Path, tmp_path: Path, backend: str, dtype: str
) -> None:
    """Their arenas are outside torch's allocator: the charge comes from the device's own figures."""
    cuda_for(backend)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")

    def cycle() -> tuple[int, CudaReading, CudaReading, CudaReading]:
        spec = ModelSpec.model_validate({"name": "m", "source": str(bert), "backend": backend})
        adapter = create_adapter(spec)
        options = LoadOptions(
            device="cuda", dtype=dtype, max_batch_tokens=4096, backend=backend, cache_dir=str(tmp_path)
        )
        before = CudaReading.take("cuda:0")
        measured = load_and_measure(adapter, options, "cuda:0")
        loaded = CudaReading.take("cuda:0")
        adapter.unload()
        release("cuda:0")
        return measured, before, loaded, CudaReading.take("cuda:0")

    cycle()  # the first load also brings the CUDA libraries' handles, which stay for the process
    measured, before, loaded, after = cycle()
    assert measured >= weight_bytes(bert) // 2  # float16 weights at the least; torch's figures see none of it
    assert loaded.used - before.used <= measured  # what it holds after the warm-up is all charged
    assert after.used - before.used <= max(measured // 10, 4 << 20)  # and unloading gives it back
