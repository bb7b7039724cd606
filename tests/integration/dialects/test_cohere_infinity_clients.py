"""Cohere's SDK and Infinity's own client against the server, each as docs/dialects/ points it here:
the vectors equal the OpenAI route's, the rankings the native rerank's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.clients import loopback_only, openai_vectors
from tests.integration.dialects.conftest import MINILM, TEXTS, post

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _on_this_machine() -> Iterator[None]:
    with loopback_only() as attempts:
        yield
    assert attempts == [], f"a client tried to leave the machine: {attempts}"


def test_cohere_embed_and_rerank(dialect_server: LiveServer) -> None:
    import cohere

    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(api_key="unused", base_url=dialect_server.url, httpx_client=http)
        embedded = client.embed(model="dense", texts=TEXTS, input_type="classification", embedding_types=["float"])
        ranked = client.rerank(model="ce", query="guitar", documents=TEXTS)
    assert embedded.embeddings.float_ is not None
    np.testing.assert_allclose(embedded.embeddings.float_, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)
    expected = post(dialect_server, "/rerank", {"model": "ce", "query": "guitar", "documents": TEXTS})["results"]
    assert [r.index for r in ranked.results] == [r["index"] for r in expected]
    assert [r.relevance_score for r in ranked.results] == pytest.approx([r["relevance_score"] for r in expected])


def test_cohere_v1_client_ranks_objects_on_rank_fields(dialect_server: LiveServer) -> None:
    import cohere

    documents = [{"title": f"Item {i}", "text": text} for i, text in enumerate(TEXTS)]
    with httpx.Client(timeout=60) as http:
        client = cohere.Client(api_key="unused", base_url=dialect_server.url, httpx_client=http)
        ranked = client.rerank(
            model="ce", query="guitar", documents=documents, rank_fields=["title", "text"], return_documents=True
        )
    # The text each object is ranked as: one `key: value` line per rank field, in their order.
    lines = [f"title: {d['title']}\ntext: {d['text']}" for d in documents]
    expected = post(dialect_server, "/rerank", {"model": "ce", "query": "guitar", "documents": lines})["results"]
    assert [r.index for r in ranked.results] == [r["index"] for r in expected]
    assert [r.relevance_score for r in ranked.results] == pytest.approx([r["relevance_score"] for r in expected])
    for result in ranked.results:
        assert result.document is not None
        assert result.document.dict() == documents[result.index]  # the object as sent, every field kept


def test_infinity_client_models_sync_and_embeddings(dialect_server: LiveServer) -> None:
    from infinity_client import Client
    from infinity_client.api.default import embeddings, models
    from infinity_client.models import OpenAIEmbeddingInputText, OpenAIEmbeddingResult, OpenAIModelInfo

    # The client sends `dimensions: 0` unless told otherwise: Infinity's "the whole vector".
    with Client(base_url=dialect_server.url, timeout=None, raise_on_unexpected_status=True) as client:
        listed = models.sync(client=client)
        vectors = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model=MINILM))
    assert isinstance(listed, OpenAIModelInfo)
    assert {m.id for m in listed.data} >= {MINILM, "dense", "ce", "clf"}
    assert all(m.owned_by == "infinity" for m in listed.data)
    assert isinstance(vectors, OpenAIEmbeddingResult)
    got = np.asarray([v.embedding for v in vectors.data], dtype=np.float64)
    np.testing.assert_allclose(got, openai_vectors(dialect_server, MINILM, TEXTS), atol=1e-6)
