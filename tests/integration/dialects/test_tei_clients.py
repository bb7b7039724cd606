"""TEI's dialect through the libraries users bring, each as docs/dialects/tei.md points it at the
server: huggingface_hub's InferenceClient, llama-index's TextEmbeddingsInference and haystack's
HuggingFaceAPITextEmbedder (the huggingface-api-haystack integration). Their vectors equal the
OpenAI route's over plain HTTP."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.clients import loopback_only, openai_vectors
from tests.integration.dialects.conftest import MINILM, TEXTS, post

# haystack sends usage statistics unless told not to.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _on_this_machine() -> Iterator[None]:
    with loopback_only() as attempts:
        yield
    assert attempts == [], f"a client tried to leave the machine: {attempts}"


@pytest.fixture
def inference_client(monkeypatch: pytest.MonkeyPatch) -> Any:
    """huggingface_hub's client, allowed to reach the local server (the tests run with HF_HUB_OFFLINE)."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)
    return InferenceClient


def test_inference_client_without_a_model_on_an_embedder_and_a_reranker(
    embedder_and_reranker: LiveServer, inference_client: Any
) -> None:
    client = inference_client(base_url=embedder_and_reranker.url, timeout=60)
    got = client.feature_extraction(TEXTS)
    np.testing.assert_allclose(got, openai_vectors(embedder_and_reranker, "dense", TEXTS), atol=1e-6)


def test_inference_client_text_classification_top_k(dialect_server: LiveServer, inference_client: Any) -> None:
    client = inference_client(model=f"{dialect_server.url}/models/clf", timeout=60)
    best = client.text_classification(TEXTS[0], top_k=1)
    every = client.text_classification(TEXTS[0])
    expected = post(dialect_server, "/classify", {"model": "clf", "input": [TEXTS[0]]})["data"][0]
    assert [(e.label, e.score) for e in best] == [(expected[0]["label"], pytest.approx(expected[0]["score"]))]
    assert len(every) == len(expected) == 3


def test_llama_index_text_embeddings_inference(dialect_server: LiveServer) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    # The client sends no model: the server's default for /embed answers (MiniLM here).
    embedding = TextEmbeddingsInference(model_name=MINILM, base_url=dialect_server.url, timeout=60)
    got = embedding.get_text_embedding_batch(TEXTS)
    np.testing.assert_allclose(got, openai_vectors(dialect_server, MINILM, TEXTS), atol=1e-6)


@pytest.mark.slow  # importing haystack takes about 5 s
def test_haystack_tei_text_embedder(dialect_server: LiveServer, inference_client: Any) -> None:
    from haystack_integrations.components.embedders.huggingface_api import HuggingFaceAPITextEmbedder

    embedder = HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params={"url": f"{dialect_server.url}/models/dense"}
    )
    got = [embedder.run(text=text)["embedding"] for text in TEXTS]
    np.testing.assert_allclose(got, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)
