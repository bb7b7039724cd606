"""The CUDA paths: ONNX Runtime's CUDA provider in float16 with IO binding, CTranslate2 in
float16 and int8_float16. Skipped without a CUDA device (and the onnx-gpu extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_registry.adapters import LoadOptions, create_adapter
from model_registry.adapters.dense import TextEncoder, as_tensor
from model_registry.backends.weights import weight_bytes
from model_registry.config import ModelSpec
from model_registry.runtime.memory import CudaReading, load_and_measure, release
from model_registry.types import Result
from tests.builders.text import tiny_bert
from tests.engines.families import FAMILIES
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


@pytest.mark.parametrize("backend", ["onnx", "ctranslate2"])
def test_cuda_engines_leave_their_outputs_on_the_device_for_the_heads(bert: Path, tmp_path: Path, backend: str) -> None:
    """Only the pooled rows come back to the host: the hidden state is taken on the device,
    without a copy, in the engine's own type."""
    cuda_for(backend)
    adapter = load(bert, backend, tmp_path, device="cuda", dtype="float16")
    assert isinstance(adapter, TextEncoder)
    batch = adapter.collate(adapter.prepare(embed_items()))
    output = adapter.run(batch.inputs)
    assert not isinstance(output.hidden, np.ndarray)
    states = adapter.states(output)
    assert states.device.type == "cuda"
    assert adapter.head_device.startswith("cuda")
    raw = as_tensor(output.hidden)
    assert raw.device.type == "cuda"
    assert raw.shape == (len(embed_items()), batch.inputs.input_ids.shape[1], int(adapter.config.hidden_size))
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
    # What it holds after the warm-up is all charged, but for torch's cache, which the heads'
    # tensors may have grown by a segment past their peak and which every model shares.
    assert loaded.used - before.used <= measured + (loaded.reserved - before.reserved)
    assert after.used - before.used <= max(measured // 10, 4 << 20)  # and unloading gives it back


def numbers(result: Result) -> list[np.ndarray]:
    """Every output but the sparse weights, as arrays, in a fixed order."""
    found = []
    for name in ("dense", "multivector", "logits", "value", "logit"):
        value = getattr(result, name, None)
        if value is not None:
            found.append(np.atleast_1d(np.asarray(value, dtype=np.float64)))
    return found


def half_difference(left: list[Result], right: list[Result]) -> float:
    """The largest difference between two result lists relative to the reference's scale (logits
    and sparse weights are not unit-length). Sparse outputs are compared as a weight per token: in
    half precision a weight near zero may fall on either side of it."""
    worst = 0.0
    for a, b in zip(left, right, strict=True):
        sparse_a, sparse_b = getattr(a, "sparse", None), getattr(b, "sparse", None)
        assert (sparse_a is None) == (sparse_b is None), f"{a} and {b} carry different outputs"
        if sparse_a is not None and sparse_b is not None:
            ours = dict(zip(map(int, sparse_a.indices), map(float, sparse_a.values), strict=True))
            theirs = dict(zip(map(int, sparse_b.indices), map(float, sparse_b.values), strict=True))
            scale = max([1.0, *map(abs, theirs.values())])
            worst = max([worst, *(abs(ours.get(k, 0.0) - theirs.get(k, 0.0)) / scale for k in ours.keys() | theirs)])
        xs, ys = numbers(a), numbers(b)
        assert len(xs) == len(ys), f"{a} and {b} carry different outputs"
        for x, y in zip(xs, ys, strict=True):
            assert x.shape == y.shape, f"{a} and {b} differ in shape"
            worst = max(worst, float(np.abs(x - y).max(initial=0.0)) / max(1.0, float(np.abs(y).max(initial=0.0))))
    return worst


@pytest.mark.parametrize(
    ("family", "engine"), [(family, engine) for family, spec in FAMILIES.items() for engine in spec[3]]
)
def test_every_family_on_a_cuda_engine_matches_torch_in_half_precision(
    tmp_path: Path, family: str, engine: str
) -> None:
    """What `backend: auto` may choose on CUDA, family by family: the engine in float16 against
    torch in float32 on the CPU, batched and one by one."""
    cuda_for(engine)
    build, kind, items, _ = FAMILIES[family]
    model = build(tmp_path / family)
    reference = run(load(model, "torch", tmp_path, kind=kind, device="cpu"), items())
    adapter = load(model, engine, tmp_path, kind=kind, device="cuda", dtype="float16")
    assert adapter.backend == engine
    batched = run(adapter, items())
    assert half_difference(batched, reference) <= 2e-2, f"{family} on {engine} differs from torch"
    single = [run(adapter, [item])[0] for item in items()]
    assert half_difference(single, batched) <= 2e-2, f"{family} on {engine}: batched differs from single"
    adapter.unload()
