"""ModernBERT, nomic_bert, Qwen3, Gemma 3 and jina-embeddings-v3's port on ONNX Runtime, each
family in its published layout: fp32 equals the torch engine within 1e-4 and a batch equals its
items one by one; int8 keeps every vector's direction; the export is cached and keyed by its
options as the BERT family's is; what the engine does not run stops the server at start, naming
the engine that does.

Each model is exported once into a module-wide cache; int8 quantizes that export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import Registry
from model_registry.adapters import Adapter
from model_registry.adapters.dense import TextEncoder
from model_registry.backends import cache as engine_cache
from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.backends.choice import choose
from model_registry.config import registry_config
from model_registry.errors import ConfigError
from model_registry.types import Result
from tests.engines.families import MODERN
from tests.engines.helpers import arrays, load, max_difference, run

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOLERANCE = 1e-4
#: int8 against torch's float32, vector by vector (the MiniLM acceptance bar is a mean of 0.99).
INT8_MEAN, INT8_WORST = 0.99, 0.98
#: One family per architecture.
ARCHITECTURES = {"modernbert": "gte-modernbert", "nomic_bert": "nomic", "qwen3": "qwen3-embedding"}
ARCHITECTURES |= {"gemma3_text": "embeddinggemma", "jina_embeddings_v3": "jina-v3-hf"}


class Built(dict[str, Path]):
    """Each family's model, built the first time a test asks for it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, family: str) -> Path:
        self[family] = MODERN[family][0](self.root / family)
        return self[family]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-cache")


@pytest.mark.parametrize("family", list(MODERN))
def test_onnx_matches_torch_and_batched_equals_single(models: Built, cache: Path, family: str) -> None:
    _, kind, items, _ = MODERN[family]
    reference = run(load(models[family], "torch", cache, kind=kind), items())
    adapter = load(models[family], "onnx", cache, kind=kind)
    assert adapter.backend == "onnx"
    batched = run(adapter, items())
    assert max_difference(batched, reference) <= TOLERANCE, f"{family} on onnx differs from torch"
    single = [run(adapter, [item])[0] for item in items()]
    assert max_difference(single, batched) <= TOLERANCE, f"{family} on onnx: batched differs from single"
    adapter.unload()


def cosines(left: list[Result], right: list[Result]) -> list[float]:
    """The cosine of each vector in `left` to its counterpart in `right`."""
    found = []
    for a, b in zip(left, right, strict=True):
        for x, y in zip(arrays(a), arrays(b), strict=True):
            for u, v in zip(np.atleast_2d(x), np.atleast_2d(y), strict=True):
                found.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))))
    return found


def artifact(adapter: Adapter) -> Path:
    """The cache directory the adapter's ONNX engine loaded its graph from."""
    from model_registry.backends.onnx.engine import OnnxEngine

    assert isinstance(adapter, TextEncoder)
    assert isinstance(adapter.engine, OnnxEngine)
    assert adapter.engine.path is not None
    return adapter.engine.path.parent


@pytest.mark.parametrize("family", ["gte-modernbert", "modern-colbert", "nomic", "qwen3-embedding", "embeddinggemma"])
def test_int8_keeps_every_vector_s_direction_and_quantizes_the_float_export(
    models: Built, cache: Path, family: str
) -> None:
    _, kind, items, _ = MODERN[family]
    reference = run(load(models[family], "torch", cache, kind=kind), items())
    floating = load(models[family], "onnx", cache, kind=kind)
    adapter = load(models[family], "onnx", cache, kind=kind, quantize="int8")
    found = cosines(run(adapter, items()), reference)
    assert np.mean(found) >= INT8_MEAN, f"{family} int8: mean cosine {np.mean(found):.4f}"
    assert min(found) >= INT8_WORST, f"{family} int8: worst cosine {min(found):.4f}"
    manifest = json.loads((artifact(adapter) / engine_cache.MANIFEST).read_text())
    assert manifest["meta"]["quantize"] == "int8"
    assert manifest["meta"]["quantized_from"] == artifact(floating).name
    adapter.unload()
    floating.unload()


def hidden(directory: Path, root: Path, quantize: str = "none") -> tuple[np.ndarray, Path]:
    from model_registry.backends.onnx.engine import OnnxEngine

    engine = OnnxEngine()
    engine.load(directory, EngineOptions(device="cpu", quantize=quantize, cache_dir=str(root)))
    ids = np.array([[2, 10, 11, 12, 3], [2, 13, 3, 0, 0]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    state = engine.run(EncoderBatch(ids, mask)).hidden
    assert engine.path is not None
    path = engine.path
    engine.release()
    return state, path


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_the_export_is_cached_and_keyed_by_options(models: Built, cache: Path, architecture: str) -> None:
    directory = models[ARCHITECTURES[architecture]]
    first, path = hidden(directory, cache)
    built = path.stat().st_mtime_ns
    again, same = hidden(directory, cache)
    assert same == path
    assert path.stat().st_mtime_ns == built, "the second load exported again"
    np.testing.assert_array_equal(first, again)
    _, quantized = hidden(directory, cache, quantize="int8")
    assert quantized.parent != path.parent
    manifest = json.loads((quantized.parent / engine_cache.MANIFEST).read_text())
    assert (manifest["meta"]["quantize"], manifest["meta"]["source"]) == ("int8", str(directory))


@pytest.mark.slow
def test_a_corrupt_export_is_rebuilt(models: Built, cache: Path) -> None:
    """The rebuild is the engine's, whatever the family: one architecture shows it, the quickest
    to export (each rebuild is an export)."""
    from tests.engines.test_cache import _plant_graph

    directory = models[ARCHITECTURES["nomic_bert"]]
    first, path = hidden(directory, cache)
    _plant_graph(path)  # a valid graph of someone else's, in place of the export
    rebuilt, again = hidden(directory, cache)
    assert again == path
    np.testing.assert_allclose(rebuilt, first, atol=1e-6)


# ---- over HTTP, against transformers on each sentence alone ------------------------------------

SENTENCES = ["a cat sleeps on the warm mat", "the stock market fell sharply today", "two dogs"]
#: family -> its pooling, as its sentence-transformers modules say.
SERVED = {
    "gte-modernbert": "cls",
    "modernbert-embed": "mean",
    "nomic": "mean",
    "qwen3-embedding": "lasttoken",
    "embeddinggemma": "mean",
}


def reference(directory: Path, pooling: str) -> np.ndarray:
    """transformers' model on each sentence alone, pooled, through the Dense layer if there is
    one, L2-normalised: sentence-transformers' recipe written out."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory)).eval()
    dense = load_file(directory / "2_Dense" / "model.safetensors") if (directory / "2_Dense").is_dir() else None
    rows = []
    with torch.inference_mode():
        for sentence in SENTENCES:
            states = model(**tokenizer(sentence, return_tensors="pt")).last_hidden_state[0]
            row = {"cls": states[0], "mean": states.mean(0), "lasttoken": states[-1]}[pooling]
            if dense is not None:
                row = dense["linear.weight"] @ row + dense["linear.bias"]
            rows.append((row / row.norm()).numpy())
    return np.stack(rows)


def test_each_family_on_onnx_serves_transformers_vectors_over_http(serve: Any, models: Built, cache: Path) -> None:
    expected = {family: reference(models[family], pooling) for family, pooling in SERVED.items()}
    entries = [{"name": f, "source": str(models[f]), "backend": "onnx", "device": "cpu"} for f in SERVED]
    live = serve({"models": entries, "engine_cache": str(cache)})
    with live.client() as client:
        for family, vectors in expected.items():
            batched = client.post("/v1/embeddings", json={"model": family, "input": SENTENCES})
            assert batched.status_code == 200, batched.text
            got = np.array([row["embedding"] for row in batched.json()["data"]])
            assert np.abs(got - vectors).max() <= TOLERANCE, f"{family} over HTTP differs from transformers"
            for sentence, vector in zip(SENTENCES, vectors, strict=True):
                alone = client.post("/v1/embeddings", json={"model": family, "input": [sentence]}).json()
                assert np.abs(np.array(alone["data"][0]["embedding"]) - vector).max() <= TOLERANCE
        engines = {m["id"]: m["details"]["engine"] for m in client.get("/v1/models").json()["data"]}
        assert client.get("/health").status_code == 200
    assert {family: engine["backend"] for family, engine in engines.items()} == dict.fromkeys(SERVED, "onnx")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family", ["gte-modernbert", "modernbert-reranker", "modern-colbert", "nomic", "qwen3-embedding", "jina-v3-hf"]
)
def test_on_cuda_in_float16_each_family_matches_torch(models: Built, tmp_path: Path, family: str) -> None:
    """The float16 path BERT takes on CUDA, against torch in float32 on the CPU, batched and one by
    one, within 2e-2 of the output's scale (as tests/engines/test_gpu.py does for the BERT family)."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA provider here (install the onnx-gpu extra on a GPU machine)")
    _, kind, items, _ = MODERN[family]
    reference = run(load(models[family], "torch", tmp_path, kind=kind, device="cpu"), items())
    adapter = load(models[family], "onnx", tmp_path, kind=kind, device="cuda", dtype="float16")
    batched = run(adapter, items())
    single = [run(adapter, [item])[0] for item in items()]
    for left, right in ((batched, reference), (single, batched)):
        for a, b in zip(left, right, strict=True):
            for x, y in zip(arrays(a), arrays(b), strict=True):
                assert np.abs(x - y).max() <= 2e-2 * max(1.0, float(np.abs(y).max())), family
    adapter.unload()


# ---- what the engine does not run --------------------------------------------------------------


def start(directory: Path, **extra: Any) -> str:
    """The start-up error of a server with this model."""
    config = registry_config({"models": [{"name": "m", "source": str(directory), **extra}]})
    with pytest.raises(ConfigError) as refused:
        Registry(config)
    return str(refused.value)


def test_ctranslate2_refuses_the_modern_architectures_naming_onnx_and_torch(models: Built) -> None:
    for architecture, family in ARCHITECTURES.items():
        message = start(models[family], backend="ctranslate2")
        assert f"architecture '{architecture}' cannot run on backend: ctranslate2" in message
        assert message.endswith("use backend: onnx, or backend: torch"), message


def test_gemma_3_is_refused_on_onnx_on_cuda_naming_torch(models: Built) -> None:
    message = start(models["embeddinggemma"], backend="onnx", device="cuda")
    assert "'gemma3_text' cannot run on backend: onnx on CUDA" in message
    assert "overflow float16" in message
    assert message.endswith("use backend: torch")
    assert start(models["embeddinggemma"], backend="ctranslate2", quantize="int8").endswith(
        "use backend: onnx, or backend: torch with quantize: none"
    )


@pytest.mark.parametrize(
    ("kind", "architecture"),
    [("reranker", "qwen3"), ("classifier", "gemma3_text"), ("classifier", "modernbert"), ("sparse", "modernbert")],
)
def test_a_family_the_export_does_not_serve_is_refused_naming_torch(kind: str, architecture: str) -> None:
    config = {"model_type": architecture, "architectures": ["ForSequenceClassification"]}
    with pytest.raises(ValueError, match=rf"backend: onnx runs '{architecture}' as .* not as a {kind} model") as caught:
        choose("m", "onnx", "none", kind, config, "cpu")
    assert str(caught.value).endswith("use backend: torch")
    assert choose("m", "auto", "none", kind, config, "cpu", host="cpu/avx2").backend == "torch"


# ---- what `auto` takes: docs/backends.md, "Per architecture" ------------------------------------

AVX2 = "an AVX2 CPU"
#: host, kind, architecture, quantize -> engine and a part of the reason.
AUTO = [
    (
        "cpu/avx2",
        "dense",
        "modernbert",
        "none",
        "torch",
        f"no engine measured faster than torch for 'modernbert' on {AVX2}",
    ),
    ("cpu/avx2", "dense", "qwen3", "none", "torch", f"measured faster than torch for 'qwen3' on {AVX2} in fp32"),
    (
        "cpu/avx2",
        "dense",
        "jina_embeddings_v3",
        "none",
        "torch",
        f"no engine measured faster than torch for 'jina_embeddings_v3' on {AVX2} in fp32",
    ),
    ("cpu/avx2", "dense", "jina_embeddings_v3", "int8", "onnx", f"for dense 'jina_embeddings_v3' on {AVX2} in int8"),
    ("cpu/avx512_vnni", "dense", "nomic_bert", "none", "torch", "engines not measured for 'nomic_bert' on an AVX-512"),
    ("cuda", "dense", "gemma3_text", "none", "torch", "engines not measured for 'gemma3_text' on CUDA in float16"),
    ("cpu/avx2", "dense", "gemma3_text", "int8", "onnx", f"for dense 'gemma3_text' on {AVX2} in int8"),
    ("cpu/amx", "multivector", "modernbert", "int8", "onnx", "for multivector 'modernbert' on an AMX CPU in int8"),
]


@pytest.mark.parametrize(("host", "kind", "architecture", "quantize", "engine", "reason"), AUTO)
def test_auto_chooses_each_architecture_by_its_own_figures(
    monkeypatch: pytest.MonkeyPatch, host: str, kind: str, architecture: str, quantize: str, engine: str, reason: str
) -> None:
    from model_registry.backends import choice

    monkeypatch.setattr(choice, "installed", lambda backend: True)
    monkeypatch.setattr(choice, "cuda_build_installed", lambda backend: True)
    device = "cuda" if host == "cuda" else "cpu"
    chosen = choose("m", "auto", quantize, kind, {"model_type": architecture}, device, host=host)
    assert (chosen.backend, chosen.reason.startswith(f"auto: {engine}, ")) == (engine, True)
    assert reason in chosen.reason, chosen.reason


def test_int8_on_a_decoder_reranker_with_auto_is_refused() -> None:
    with pytest.raises(ValueError, match="found no engine for a reranker 'qwen3' model"):
        choose("m", "auto", "int8", "reranker", {"model_type": "qwen3"}, "cpu", host="cpu/avx2")
