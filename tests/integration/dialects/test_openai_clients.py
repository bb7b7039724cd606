"""The OpenAI dialect through the libraries users bring, each as docs/dialects/openai.md points it
at the server: the vectors each gets equal the OpenAI route's over plain HTTP."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.clients import loopback_only, openai_vectors
from tests.integration.dialects.conftest import MINILM, TEXTS

# litellm fetches a price list when it is imported unless told to read its packaged copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _on_this_machine() -> Iterator[None]:
    with loopback_only() as attempts:
        yield
    assert attempts == [], f"a client tried to leave the machine: {attempts}"


def test_openai_embeddings_models_list_and_retrieve(dialect_server: LiveServer) -> None:
    import openai

    with openai.OpenAI(base_url=f"{dialect_server.url}/v1", api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(model="dense", input=TEXTS)  # the client asks for base64
        floats = client.embeddings.create(model="dense", input=TEXTS, encoding_format="float", dimensions=8)
        listed = client.models.list()
        one = client.models.retrieve("dense")
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("nope")
    expected = openai_vectors(dialect_server, "dense", TEXTS)
    np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-6)
    cut = expected[:, :8] / np.linalg.norm(expected[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose([d.embedding for d in floats.data], cut, atol=1e-6)
    assert {m.id for m in listed} >= {MINILM, "dense", "ce", "clf"}
    assert (one.id, one.object, one.owned_by) == ("dense", "model", "infinity")
    assert missing.value.status_code == 404
    assert missing.value.code == "model_not_found"
    assert "nope" in missing.value.message


@pytest.mark.slow  # importing litellm takes about 5 s
def test_litellm_embedding(dialect_server: LiveServer) -> None:
    import litellm

    answer = litellm.embedding(
        model="openai/dense", input=TEXTS, api_base=f"{dialect_server.url}/v1", api_key="unused", max_retries=0
    )
    got = [d["embedding"] for d in answer.data]
    np.testing.assert_allclose(got, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)


def test_langchain_openai_embeddings(dialect_server: LiveServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="dense",
        base_url=f"{dialect_server.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,  # else it sends tiktoken's ids, which the server reads as its own
        max_retries=0,
    )
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[0])
    expected = openai_vectors(dialect_server, "dense", TEXTS)
    np.testing.assert_allclose(documents, expected, atol=1e-6)
    np.testing.assert_allclose(query, expected[0], atol=1e-6)


def test_llama_index_openai_embedding(dialect_server: LiveServer) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedding = OpenAIEmbedding(
        model_name="dense", api_base=f"{dialect_server.url}/v1", api_key="unused", max_retries=0
    )
    got = embedding.get_text_embedding_batch(TEXTS)
    np.testing.assert_allclose(got, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)


@pytest.mark.slow  # dspy imports litellm
def test_dspy_embedder(dialect_server: LiveServer) -> None:
    import dspy

    embedder = dspy.Embedder(
        "openai/dense", api_base=f"{dialect_server.url}/v1", api_key="unused", caching=False, num_retries=0
    )
    np.testing.assert_allclose(embedder(TEXTS), openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)


def test_openai_retrieves_a_model_whose_name_holds_a_slash(serve: Any, dialect_models: dict[str, Path]) -> None:
    import openai

    server = serve({"models": [{"name": "org/dense", "source": str(dialect_models["dense"])}]})
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        one = client.models.retrieve("org/dense")
    assert (one.id, one.owned_by) == ("org/dense", "infinity")
