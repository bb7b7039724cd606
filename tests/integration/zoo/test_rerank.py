"""Cross-encoder and LLM rerankers over HTTP: parity with sentence-transformers, semantics, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders.zoo import (
    tiny_cross_encoder,
    tiny_llm_reranker,
    tiny_modernbert_cross_encoder,
    tiny_xlmr_cross_encoder,
)
from tests.conftest import read_sts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_cross_encoder(tmp_path_factory.mktemp("ce"))


@pytest.fixture(scope="module")
def llm_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm_reranker(tmp_path_factory.mktemp("qwen-ce"))


def predict(directory: Path, query: str, documents: list[str], **kwargs: Any) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(directory), device="cpu")
    return np.asarray(model.predict([(query, d) for d in documents], batch_size=8, **kwargs), dtype=np.float64)


def rerank(client: Any, model: str, query: str, documents: list[Any], **extra: Any) -> Any:
    return client.post("/rerank", json={"model": model, "query": query, "documents": documents, **extra})


def test_cross_encoder_matches_sentence_transformers(serve: Any, reranker_dir: Path, data_dir: Path) -> None:
    rows = read_sts(data_dir / "stsbenchmark.tsv.gz")[:40]
    query, documents = rows[0][0], [r[1] for r in rows]
    expected = predict(reranker_dir, query, documents)
    raw_expected = predict(reranker_dir, query, documents, activation_fn=__import__("torch").nn.Identity())
    server = serve({"models": [{"name": "ce", "source": str(reranker_dir), "backend": "torch"}]})
    with server.client() as client:
        body = rerank(client, "ce", query, documents, return_documents=True).json()
        raw = rerank(client, "ce", query, documents, raw_scores=True).json()
        single = [rerank(client, "ce", query, [d]).json()["results"][0]["relevance_score"] for d in documents[:6]]
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(documents))], expected, atol=1e-5)
    ranked = [r["relevance_score"] for r in body["results"]]
    assert ranked == sorted(ranked, reverse=True)
    assert body["results"][0]["index"] == int(np.argmax(expected))
    assert all(r["document"] == documents[r["index"]] for r in body["results"])
    assert body["meta"]["scoring_method"] == "cross-encoder"
    got_raw = {r["index"]: r["relevance_score"] for r in raw["results"]}
    np.testing.assert_allclose([got_raw[i] for i in range(len(documents))], raw_expected, atol=1e-5)
    assert all(r["document"] is None for r in raw["results"])
    # batched equals single
    np.testing.assert_allclose(single, [got[i] for i in range(6)], atol=1e-5)


@pytest.mark.parametrize(
    ("builder", "backend"),
    [
        (tiny_xlmr_cross_encoder, "torch"),
        (tiny_xlmr_cross_encoder, "onnx"),
        (tiny_xlmr_cross_encoder, "ctranslate2"),
        (tiny_modernbert_cross_encoder, "torch"),
        (tiny_modernbert_cross_encoder, "onnx"),
    ],
)
def test_other_encoder_cross_encoders_match(serve: Any, tmp_path: Path, builder: Any, backend: str) -> None:
    """XLM-R (bge-reranker-v2-m3's architecture) and ModernBERT on every engine that serves them."""
    directory = builder(tmp_path / "ce")
    query = "Which animal sleeps on the windowsill?"
    documents = ["The cat sleeps on the warm windowsill.", "Stocks fell.", "A plane is taking off from the airport."]
    expected = predict(directory, query, documents)
    entry = {"name": "ce", "source": str(directory), "backend": backend, "device": "cpu"}
    server = serve({"models": [entry], "engine_cache": str(tmp_path / "engines")})
    with server.client() as client:
        body = rerank(client, "ce", query, documents).json()
        single = [rerank(client, "ce", query, [d]).json()["results"][0]["relevance_score"] for d in documents]
        engine = client.get("/v1/models/ce").json()["details"]["engine"]
    assert engine["backend"] == backend
    tolerance = 1e-5 if backend == "torch" else 1e-4
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(3)], expected, atol=tolerance)
    np.testing.assert_allclose(single, expected, atol=tolerance)


def test_llm_reranker_without_a_configured_pad_token(serve: Any, tmp_path: Path) -> None:
    """transformers cannot batch such a model; the server scores the last real token of each row."""
    directory = tiny_llm_reranker(tmp_path / "qwen", config_pad=False)
    query = "Which animal sleeps on the windowsill?"
    documents = ["The cat sleeps on the warm windowsill.", "Stocks fell.", "A plane is taking off from the airport."]
    expected = [float(predict(directory, query, [d])[0]) for d in documents]  # one pair at a time
    server = serve({"models": [{"name": "qwen", "source": str(directory), "backend": "torch"}]})
    with server.client() as client:
        body = rerank(client, "qwen", query, documents).json()
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(3)], expected, atol=1e-5)


def test_llm_reranker_matches_sentence_transformers(serve: Any, llm_reranker_dir: Path) -> None:
    query = "Which animal sleeps on the windowsill?"
    documents = ["The cat sleeps on the warm windowsill.", "Stocks fell.", "A plane is taking off from the airport."]
    expected = predict(llm_reranker_dir, query, documents)
    server = serve({"models": [{"name": "qwen", "source": str(llm_reranker_dir), "backend": "torch"}]})
    with server.client() as client:
        body = rerank(client, "qwen", query, documents).json()
        single = [rerank(client, "qwen", query, [d]).json()["results"][0]["relevance_score"] for d in documents]
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(3)], expected, atol=1e-5)
    np.testing.assert_allclose(single, expected, atol=1e-5)


def test_top_n_many_documents_and_long_pairs(serve: Any, reranker_dir: Path) -> None:
    documents = [f"document number {i} about a cat" for i in range(2048)]
    long_doc = "the cat sleeps on the warm windowsill " * 60
    server = serve({"models": [{"name": "ce", "source": str(reranker_dir), "backend": "torch"}]})
    with server.client() as client:
        everything = rerank(client, "ce", "a cat", documents).json()["results"]
        top = rerank(client, "ce", "a cat", documents, top_n=5).json()["results"]
        long_ok = rerank(client, "ce", "a cat", [long_doc])
        long_bad = rerank(client, "ce", "a cat", [long_doc], truncate=False)
    assert len(everything) == 2048
    scores = [r["relevance_score"] for r in everything]
    assert scores == sorted(scores, reverse=True)
    assert [r["index"] for r in top] == [r["index"] for r in everything[:5]]
    assert long_ok.status_code == 200, long_ok.text
    assert long_bad.status_code == 400
    assert long_bad.json()["error"]["code"] == "input_too_long"


def test_query_is_kept_whole_when_the_document_is_cut(reranker_dir: Path) -> None:
    from model_registry.adapters.base import LoadOptions
    from model_registry.adapters.sequence import RerankerAdapter
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect
    from model_registry.types import PairItem

    adapter = RerankerAdapter(detect(reranker_dir, ModelSpec(name="ce", source=str(reranker_dir))))
    adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=4096))
    query = "what does the cat do on the warm windowsill " * 4
    prepared = adapter.prepare([PairItem(query, "the cat sleeps " * 100)])
    assert adapter.tokenizer is not None
    hf = adapter.tokenizer.tokenizer
    query_ids = hf(query, add_special_tokens=False)["input_ids"]
    ids = list(prepared[0].data.ids)
    assert len(ids) == adapter.max_length
    assert ids[1 : 1 + len(query_ids)] == query_ids


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "  ", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a", 3]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ],
)
def test_bad_rerank_requests_are_clear_4xx(serve: Any, reranker_dir: Path, body: dict[str, Any], param: str) -> None:
    server = serve({"models": [{"name": "ce", "source": str(reranker_dir), "backend": "torch"}]})
    with server.client() as client:
        response = client.post("/rerank", json={"model": "ce", **body})
        still = rerank(client, "ce", "q", ["a"])
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["param"] == param
    assert still.status_code == 200


def test_reranker_has_no_embeddings(serve: Any, reranker_dir: Path) -> None:
    server = serve({"models": [{"name": "ce", "source": str(reranker_dir), "backend": "torch"}]})
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "ce", "input": ["a"]})
    assert response.status_code == 400
    assert "rerank" in response.json()["error"]["message"]
