"""Catalogue records on tiny random models in each published layout, found by hub id in a local cache.

`source: <published id>` with no other key: the record supplies what the files cannot say (an
LLM reranker's kind and prompt), the files the rest. Scores are compared with transformers' full
forward on the text each model card builds (the references of test_llm_rerank).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_registry.zoo.catalogue import RECORDS
from tests.builders.catalogue import tiny_embeddinggemma, tiny_gte_modernbert, tiny_modernbert_embedder, tiny_nomic
from tests.builders.gte import tiny_gte_multilingual
from tests.builders.hub import lay_out_cache
from tests.builders.jina import tiny_jina_v3
from tests.builders.llm_rerankers import (
    tiny_gemma_reranker,
    tiny_mxbai_reranker,
    tiny_qwen3_embedding,
    tiny_qwen3_reranker,
)
from tests.builders.media import tiny_siglip2, tiny_siglip2_naflex
from tests.builders.routers import tiny_inference_free_gte, tiny_inference_free_sparse
from tests.builders.static import tiny_potion, tiny_static_embedding
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_bge_m3, tiny_modern_colbert, tiny_pylate, tiny_xlmr_cross_encoder
from tests.integration.zoo.test_jina_v3 import SENTENCES as JINA_SENTENCES
from tests.integration.zoo.test_jina_v3 import reference as jina_reference
from tests.integration.zoo.test_llm_rerank import (
    DOCUMENTS,
    QUERY,
    flag_llm_reranker,
    mxbai_rerank_v2,
    qwen3_card,
    reference,
    sigmoid,
)

pytestmark = pytest.mark.integration

Builder = Callable[[Path], Path]


def _answerai(root: Path) -> Path:
    return tiny_pylate(root, prefixes=("[unused0]", "[unused1]"))


#: Published id -> a tiny random model in its layout.
LAYOUTS: dict[str, Builder] = {
    "Qwen/Qwen3-Embedding-0.6B": tiny_qwen3_embedding,
    "Qwen/Qwen3-Embedding-4B": tiny_qwen3_embedding,
    "Qwen/Qwen3-Embedding-8B": tiny_qwen3_embedding,
    "Qwen/Qwen3-Reranker-0.6B": tiny_qwen3_reranker,
    "Qwen/Qwen3-Reranker-4B": tiny_qwen3_reranker,
    "Qwen/Qwen3-Reranker-8B": tiny_qwen3_reranker,
    "BAAI/bge-reranker-v2-gemma": tiny_gemma_reranker,
    "mixedbread-ai/mxbai-rerank-base-v2": tiny_mxbai_reranker,
    "mixedbread-ai/mxbai-rerank-large-v2": tiny_mxbai_reranker,
    "BAAI/bge-m3": tiny_bge_m3,
    "BAAI/bge-reranker-v2-m3": tiny_xlmr_cross_encoder,
    "lightonai/GTE-ModernColBERT-v1": tiny_modern_colbert,
    "answerdotai/answerai-colbert-small-v1": _answerai,
    "google/siglip2-base-patch16-224": tiny_siglip2,
    "google/siglip2-base-patch16-naflex": tiny_siglip2_naflex,
    "sentence-transformers/all-MiniLM-L6-v2": tiny_bert,
    "google/embeddinggemma-300m": tiny_embeddinggemma,
    "Alibaba-NLP/gte-modernbert-base": tiny_gte_modernbert,
    "nomic-ai/modernbert-embed-base": tiny_modernbert_embedder,
    "nomic-ai/nomic-embed-text-v1.5": tiny_nomic,
    "Alibaba-NLP/gte-multilingual-base": tiny_gte_multilingual,
    "jinaai/jina-embeddings-v3": tiny_jina_v3,
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill": tiny_inference_free_sparse,
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-gte": tiny_inference_free_gte,
    "minishlab/potion-base-8M": tiny_potion,
    "minishlab/potion-retrieval-32M": tiny_potion,
    "sentence-transformers/static-retrieval-mrl-en-v1": tiny_static_embedding,
    "sentence-transformers/static-similarity-mrl-multilingual-v1": tiny_static_embedding,
}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Builder], Path]:
    """Lay a tiny model out in a local hub cache under a published id."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))

    def put(repo: str, build: Builder) -> Path:
        return build(lay_out_cache(cache, repo, "0123abcd"))

    return put


def test_every_record_has_a_layout_here() -> None:
    assert sorted(RECORDS) == sorted(LAYOUTS)


@pytest.mark.parametrize("model_id", sorted(LAYOUTS))
def test_a_published_id_is_detected_as_its_record_says(hub: Callable[[str, Builder], Path], model_id: str) -> None:
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect
    from model_registry.zoo.sources import resolve_source

    hub(model_id, LAYOUTS[model_id])
    spec = ModelSpec(name="m", source=model_id)
    layout = detect(resolve_source(spec.source), spec)
    assert layout.kind.value == RECORDS[model_id].kind
    assert layout.config["model_type"] == RECORDS[model_id].architecture
    assert layout.notes["catalogue"] == model_id


def _qwen3(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    return reference(directory, [qwen3_card(query, d) for d in documents], "yes", "no")[0]


def _gemma(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    return sigmoid(flag_llm_reranker(directory, query, documents))


def _mxbai(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    return sigmoid(mxbai_rerank_v2(directory, query, documents))


#: Each record's reference: p(relevant) per document, as its model card or library computes it.
REFERENCES: dict[str, Callable[[Path, str, list[str]], np.ndarray]] = {
    "Qwen/Qwen3-Reranker-0.6B": _qwen3,
    "BAAI/bge-reranker-v2-gemma": _gemma,
    "mixedbread-ai/mxbai-rerank-base-v2": _mxbai,
}


@pytest.mark.parametrize("model_id", sorted(REFERENCES))
def test_an_llm_reranker_by_its_id_alone_scores_as_its_reference(
    serve: Any, hub: Callable[[str, Builder], Path], model_id: str
) -> None:
    directory = hub(model_id, LAYOUTS[model_id])
    expected = REFERENCES[model_id](directory, QUERY, DOCUMENTS)
    live = serve({"models": [{"name": "llm", "source": model_id}]})
    with live.client() as client:
        answer = client.post("/rerank", json={"model": "llm", "query": QUERY, "documents": DOCUMENTS})
        assert answer.status_code == 200, answer.text
        details = client.get("/v1/models/llm").json()["details"]
    got = [r["relevance_score"] for r in sorted(answer.json()["results"], key=lambda r: r["index"])]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert details["catalogue"] == model_id


def test_without_the_record_the_same_files_are_refused_not_embedded(serve: Any, tmp_path: Path) -> None:
    """The record is what makes the id serve: the same files by path are a bare causal LM."""
    directory = tiny_qwen3_reranker(tmp_path / "qwen3")
    live = serve({"models": [{"name": "llm", "source": str(directory)}]})
    with live.client() as client:
        answer = client.post("/rerank", json={"model": "llm", "query": QUERY, "documents": DOCUMENTS})
        assert answer.status_code in (400, 503), answer.text


def test_yaml_keys_override_the_record(serve: Any, hub: Callable[[str, Builder], Path]) -> None:
    directory = hub("Qwen/Qwen3-Reranker-0.6B", tiny_qwen3_reranker)
    instruction = "Find the passage about animals"
    expected, _ = reference(directory, [qwen3_card(QUERY, d, instruction) for d in DOCUMENTS], "yes", "no")
    live = serve({"models": [{"name": "llm", "source": "Qwen/Qwen3-Reranker-0.6B", "instruction": instruction}]})
    with live.client() as client:
        answer = client.post("/rerank", json={"model": "llm", "query": QUERY, "documents": DOCUMENTS})
        assert answer.status_code == 200, answer.text
    got = [r["relevance_score"] for r in sorted(answer.json()["results"], key=lambda r: r["index"])]
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_jina_v3_by_its_id_runs_its_task_adapters_on_transformers_port(
    serve: Any, hub: Callable[[str, Builder], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its layout names code of its own (auto_map): transformers' port serves it without that code."""
    monkeypatch.setenv("INFINITY_ENGINE_CACHE", str(tmp_path / "engines"))
    directory = hub("jinaai/jina-embeddings-v3", tiny_jina_v3)
    live = serve({"models": [{"name": "jina", "source": "jinaai/jina-embeddings-v3"}]})
    body = {"model": "jina", "input": JINA_SENTENCES, "task": "retrieval.query"}
    with live.client() as client:
        answer = client.post("/v1/embeddings", json=body)
        assert answer.status_code == 200, answer.text
        details = client.get("/v1/models/jina").json()["details"]
    got = np.asarray([row["embedding"] for row in answer.json()["data"]])
    np.testing.assert_allclose(got, jina_reference(directory, "retrieval.query"), atol=1e-4)
    assert details["catalogue"] == "jinaai/jina-embeddings-v3"
    assert "native jina_embeddings_v3 port" in details["code"]


def test_the_catalogue_route_lists_every_record(serve: Any) -> None:
    live = serve({"models": [{"name": "fake", "source": "fake", "kind": "fake"}]})
    with live.client() as client:
        answer = client.get("/v1/catalogue")
    assert answer.status_code == 200, answer.text
    listed = {record["id"]: record for record in answer.json()["data"]}
    assert set(listed) == set(RECORDS)
    assert listed["Qwen/Qwen3-Reranker-0.6B"]["template"] == "qwen3-reranker"
    assert listed["lightonai/GTE-ModernColBERT-v1"]["document_length"] == 300
    assert listed["sentence-transformers/all-MiniLM-L6-v2"]["fastest"]["cuda"] == "onnx float16"


def test_nomic_as_published_serves_8192_tokens_past_its_trained_2048(serve: Any, tmp_path: Path) -> None:
    """Rotary positions have no table: sentence-transformers' `max_seq_length` of 8,192 holds, and a
    text longer than `max_position_embeddings` is embedded whole, as the reference embeds it."""
    from transformers import AutoModel, AutoTokenizer

    directory = tiny_nomic(tmp_path / "nomic")
    for name, changes in (("config.json", {"max_position_embeddings": 64}), ("sentence_bert_config.json", {})):
        saved = json.loads((directory / name).read_text())
        (directory / name).write_text(json.dumps({**saved, **changes, "max_seq_length": 8192}))
    text = "search_document: " + " ".join(["the cat sat on the mat and looked at the market"] * 12)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    encoded = tokenizer(text, return_tensors="pt")
    assert encoded["input_ids"].shape[1] > 64  # past the positions its config gives
    with torch.inference_mode():
        pooled = AutoModel.from_pretrained(str(directory)).eval()(**encoded).last_hidden_state[0].mean(dim=0)
    live = serve({"models": [{"name": "nomic", "source": str(directory)}]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "nomic", "input": [text]})
        assert answer.status_code == 200, answer.text
        assert client.get("/v1/models/nomic").json()["max_length"] == 8192
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], (pooled / pooled.norm()).numpy(), atol=1e-4)


def test_nomic_by_its_id_runs_transformers_native_port_and_says_so(
    serve: Any, hub: Callable[[str, Builder], Path]
) -> None:
    """Its config names nomic's hub code; with no `trust_remote_code` transformers' port serves it."""
    from transformers import AutoModel, AutoTokenizer

    directory = hub("nomic-ai/nomic-embed-text-v1.5", LAYOUTS["nomic-ai/nomic-embed-text-v1.5"])
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory)).eval()
    texts = ["search_query: a cat on a mat", "search_query: the market fell"]
    rows = []
    with torch.inference_mode():
        for text in texts:
            pooled = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(dim=0)
            rows.append((pooled / pooled.norm()).numpy())
    live = serve({"models": [{"name": "nomic", "source": "nomic-ai/nomic-embed-text-v1.5"}]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "nomic", "input": texts})
        assert answer.status_code == 200, answer.text
        details = client.get("/v1/models/nomic").json()["details"]
    np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], np.stack(rows), atol=1e-4)
    assert "native nomic_bert port" in details["code"]
    assert details["catalogue"] == "nomic-ai/nomic-embed-text-v1.5"
