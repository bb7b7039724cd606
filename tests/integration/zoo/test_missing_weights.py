"""A model is served only with every weight its kind needs: never a head initialised at random.

transformers fills whatever a checkpoint lacks with random values and only reports it; these
directories would be answered 200 with scores that mean nothing. Each must be a 503 that names
the missing weights, and `/v1/models` keeps the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.builders.zoo import tiny_cross_encoder, tiny_masked_lm

pytestmark = pytest.mark.integration


def test_a_base_model_configured_as_a_classifier_is_refused_not_given_a_random_head(serve: Any, tmp_path: Path) -> None:
    directory = tiny_masked_lm(tmp_path / "mlm")
    live = serve({"models": [{"name": "clf", "source": str(directory), "kind": "classifier", "backend": "torch"}]})
    with live.client() as client:
        answer = client.post("/classify", json={"model": "clf", "input": ["a cat sat on the mat"]})
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert "classifier.weight" in message
        assert "random" in message
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert listed["clf"]["status"] == "failed"
        assert "classifier.weight" in listed["clf"]["error"]


@pytest.mark.parametrize("backend", ["onnx", "ctranslate2"])
def test_an_engine_artifact_is_never_built_from_a_checkpoint_with_weights_missing(
    serve: Any, tmp_path: Path, backend: str
) -> None:
    """The export and the conversion load the checkpoint too: a classifier head missing there is
    refused before any artifact is built (a random head would be baked into the artifact)."""
    directory = tiny_masked_lm(tmp_path / "mlm")
    cache = tmp_path / "cache"
    model = {"name": "clf", "source": str(directory), "kind": "classifier", "backend": backend}
    live = serve({"models": [model], "engine_cache": str(cache)})
    with live.client() as client:
        answer = client.post("/classify", json={"model": "clf", "input": ["a cat sat on the mat"]})
        assert answer.status_code == 503, answer.text
        assert "classifier" in answer.json()["error"]["message"]


@pytest.mark.parametrize("backend", ["torch", "onnx", "ctranslate2"])
def test_a_complete_checkpoint_still_serves_on_every_engine(serve: Any, tmp_path: Path, backend: str) -> None:
    """A cross-encoder carries its head, and a masked LM's missing BERT pooler is never read by
    mean pooling: both load."""
    reranker = tiny_cross_encoder(tmp_path / "ce")
    encoder = tiny_masked_lm(tmp_path / "mlm")
    models = [
        {"name": "ce", "source": str(reranker), "backend": backend},
        {"name": "mean", "source": str(encoder), "kind": "dense", "backend": backend},
    ]
    live = serve({"models": models, "engine_cache": str(tmp_path / "cache")})
    with live.client() as client:
        ranked = client.post("/rerank", json={"model": "ce", "query": "a cat", "documents": ["a dog", "a cat"]})
        assert ranked.status_code == 200, ranked.text
        embedded = client.post("/v1/embeddings", json={"model": "mean", "input": ["a cat"]})
        assert embedded.status_code == 200, embedded.text
