"""vLLM's /score, rerank and /pooling over plain HTTP (vLLM's documented shapes), Infinity's own
client beside litellm's vLLM provider, and what /models says of models that are not loaded yet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.clients import loopback_only
from tests.integration.dialects.conftest import MINILM, TEXTS, post

# litellm fetches a price list when it is imported unless told to read its packaged copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = pytest.mark.integration


def rerank_scores(server: LiveServer, model: str, query: str, documents: list[str]) -> list[float]:
    ranked = post(server, "/rerank", {"model": model, "query": query, "documents": documents})["results"]
    by_index = {r["index"]: r["relevance_score"] for r in ranked}
    return [by_index[i] for i in range(len(documents))]


def test_score_one_to_one_one_to_many_and_pairs_with_a_cross_encoder(dialect_server: LiveServer) -> None:
    one = post(dialect_server, "/score", {"model": "ce", "text_1": "guitar", "text_2": TEXTS[0]})
    many = post(dialect_server, "/v1/score", {"model": "ce", "text_1": "guitar", "text_2": TEXTS})
    queries = ["guitar", "money", "snow"]
    pairs = post(dialect_server, "/score", {"model": "ce", "text_1": queries, "text_2": TEXTS})
    expected = rerank_scores(dialect_server, "ce", "guitar", TEXTS)
    assert one["object"] == "list"
    assert one["id"].startswith("score-")
    assert one["data"] == [{"index": 0, "object": "score", "score": pytest.approx(expected[0], abs=1e-6)}]
    assert [d["score"] for d in many["data"]] == pytest.approx(expected, abs=1e-6)
    each = [rerank_scores(dialect_server, "ce", q, [t])[0] for q, t in zip(queries, TEXTS, strict=True)]
    assert [d["score"] for d in pairs["data"]] == pytest.approx(each, abs=1e-6)
    assert pairs["usage"]["prompt_tokens"] > 0


#: vLLM's answers as its server writes them (`model_dump()` of vllm/entrypoints/pooling/score/protocol.py's
#: `RerankResponse` and `ScoreResponse`): the keys of each object, null ones included.
VLLM_RERANK = {"id", "model", "usage", "results"}
VLLM_RERANK_USAGE = {"prompt_tokens", "total_tokens"}
VLLM_RERANK_RESULT = {"index", "document", "relevance_score"}
VLLM_USAGE_INFO = {"prompt_tokens": int, "total_tokens": int, "completion_tokens": int, "prompt_tokens_details": None}
#: A body that sets one of vLLM's own rerank fields (here its default), so the shared paths answer in vLLM's shape.
VLLM_FIELD = {"truncate_prompt_tokens": -1}


def test_score_usage_is_vllms_usage_info(dialect_server: LiveServer) -> None:
    usage = post(dialect_server, "/score", {"model": "ce", "text_1": "guitar", "text_2": TEXTS})["usage"]
    assert set(usage) == set(VLLM_USAGE_INFO)
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    assert usage["completion_tokens"] == 0
    assert usage["prompt_tokens_details"] is None


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_answers_in_vllms_shape(dialect_server: LiveServer, path: str) -> None:
    answer = post(dialect_server, path, {"model": "ce", "query": "guitar", "documents": TEXTS, **VLLM_FIELD})
    expected = rerank_scores(dialect_server, "ce", "guitar", TEXTS)
    assert set(answer) == VLLM_RERANK
    assert answer["id"].startswith("rerank-")
    assert answer["model"] == "ce"
    assert set(answer["usage"]) == VLLM_RERANK_USAGE
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    results = answer["results"]
    assert [set(r) for r in results] == [VLLM_RERANK_RESULT] * 3
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -expected[i])
    assert [r["document"] for r in results] == [{"text": TEXTS[r["index"]], "multi_modal": None} for r in results]
    assert [r["relevance_score"] for r in results] == pytest.approx([expected[r["index"]] for r in results], abs=1e-6)


def test_vllm_rerank_top_n_activation_and_default_model(dialect_server: LiveServer) -> None:
    body = {"query": "guitar", "documents": TEXTS, **VLLM_FIELD}  # no model: the configured reranker
    every = post(dialect_server, "/v1/rerank", body)
    top = post(dialect_server, "/v1/rerank", {**body, "top_n": 2})
    zero = post(dialect_server, "/v1/rerank", {**body, "top_n": 0})
    raw = post(
        dialect_server, "/v2/rerank", {"model": "ce", "query": "guitar", "documents": TEXTS, "use_activation": False}
    )
    assert every["model"] == "ce"
    assert [r["index"] for r in top["results"]] == [r["index"] for r in every["results"][:2]]
    assert [r["index"] for r in zero["results"]] == [r["index"] for r in every["results"]]
    assert set(raw) == VLLM_RERANK
    logits = {r["index"]: r["relevance_score"] for r in raw["results"]}
    activated = {r["index"]: r["relevance_score"] for r in every["results"]}
    for i, logit in logits.items():
        assert 1 / (1 + np.exp(-logit)) == pytest.approx(activated[i], abs=1e-6)  # one label: a sigmoid


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_a_body_without_vllms_fields_stays_cohere(dialect_server: LiveServer, path: str) -> None:
    answer = post(dialect_server, path, {"model": "ce", "query": "guitar", "documents": TEXTS, "top_n": 1})
    assert set(answer) == {"id", "results", "meta"}
    assert set(answer["results"][0]) <= {"index", "relevance_score", "document"}


def test_score_with_an_embedding_model_is_the_cosine(dialect_server: LiveServer) -> None:
    got = post(dialect_server, "/score", {"model": MINILM, "text_1": TEXTS[0], "text_2": TEXTS})
    data = post(dialect_server, "/v1/embeddings", {"model": MINILM, "input": TEXTS})["data"]
    vectors = np.asarray([d["embedding"] for d in data])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose([d["score"] for d in got["data"]], vectors @ vectors[0], atol=1e-5)


def test_pooling_answers_token_vectors_or_the_vector(dialect_server: LiveServer) -> None:
    tokens = post(dialect_server, "/pooling", {"model": "colbert", "input": TEXTS})
    dense = post(dialect_server, "/pooling", {"model": MINILM, "input": TEXTS[0]})
    multi = post(dialect_server, "/v1/encode", {"model": "colbert", "input": TEXTS, "outputs": ["multivector"]})
    vectors = post(dialect_server, "/v1/embeddings", {"model": MINILM, "input": TEXTS[:1]})["data"]
    assert [d["object"] for d in tokens["data"]] == ["pooling"] * 3
    for got, expected in zip(tokens["data"], multi["data"], strict=True):
        np.testing.assert_allclose(got["data"], expected["multivector"], atol=1e-6)
    np.testing.assert_allclose(dense["data"][0]["data"], vectors[0]["embedding"], atol=1e-6)


def test_score_use_activation_false_answers_the_raw_logit(dialect_server: LiveServer) -> None:
    body = {"model": "ce", "text_1": "guitar", "text_2": TEXTS}
    activated = [d["score"] for d in post(dialect_server, "/score", body)["data"]]
    for off in ({"use_activation": False}, {"softmax": False}, {"activation": False}):
        raw = np.asarray([d["score"] for d in post(dialect_server, "/score", {**body, **off})["data"]])
        np.testing.assert_allclose(1 / (1 + np.exp(-raw)), activated, atol=1e-6)  # one label: a sigmoid
        assert not np.allclose(raw, activated)


def test_pooling_takes_vllms_options(dialect_server: LiveServer) -> None:
    full = np.asarray(post(dialect_server, "/pooling", {"model": MINILM, "input": TEXTS[0]})["data"][0]["data"])
    cut = post(dialect_server, "/pooling", {"model": MINILM, "input": TEXTS[0], "dimensions": 8})["data"][0]["data"]
    np.testing.assert_allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    ids = [101, 7592, 2088, 102]
    by_ids = post(dialect_server, "/pooling", {"model": MINILM, "input": ids})["data"][0]["data"]
    openai = post(dialect_server, "/v1/embeddings", {"model": MINILM, "input": [ids]})["data"][0]["embedding"]
    np.testing.assert_allclose(by_ids, openai, atol=1e-6)
    pooled = post(dialect_server, "/pooling", {"model": MINILM, "input": TEXTS[0], "task": "embed"})
    tokens = post(dialect_server, "/pooling", {"model": "colbert", "input": TEXTS[0], "task": "token_embed"})
    assert np.asarray(tokens["data"][0]["data"]).ndim == 2
    np.testing.assert_allclose(pooled["data"][0]["data"], full, atol=1e-6)
    cut_at = {"model": MINILM, "input": TEXTS[0], "truncate_prompt_tokens": 4}
    left = post(dialect_server, "/pooling", cut_at)["data"][0]["data"]
    right = post(dialect_server, "/pooling", {**cut_at, "truncation_side": "right"})["data"][0]["data"]
    assert np.allclose(left, post(dialect_server, "/pooling", {**cut_at, "truncation_side": "left"})["data"][0]["data"])
    assert not np.allclose(left, right)


BAD: list[tuple[str, str, dict[str, Any], int]] = [
    ("lengths differ", "/score", {"model": "ce", "text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, 400),
    ("empty text", "/score", {"model": "ce", "text_1": "a", "text_2": [" "]}, 400),
    ("unknown model", "/score", {"model": "nope", "text_1": "a", "text_2": "b"}, 404),
    ("no text_2", "/v1/score", {"model": "ce", "text_1": "a"}, 422),
    ("a classifier cannot score", "/score", {"model": "clf", "text_1": "a", "text_2": "b"}, 400),
    ("pooling a reranker", "/pooling", {"model": "ce", "input": "a"}, 400),
    (
        "unnormalised from a normalising model",
        "/pooling",
        {"model": MINILM, "input": "a", "use_activation": False},
        400,
    ),
    ("dimensions of token vectors", "/pooling", {"model": "colbert", "input": "a", "dimensions": 8}, 400),
    ("a pooled vector of a token model", "/pooling", {"model": "colbert", "input": "a", "task": "embed"}, 400),
    ("token vectors of a pooled model", "/pooling", {"model": MINILM, "input": "a", "task": "token_embed"}, 400),
    ("no special tokens", "/pooling", {"model": MINILM, "input": "a", "add_special_tokens": False}, 400),
    ("padded", "/score", {"model": "ce", "text_1": "a", "text_2": "b", "padding": "max_length"}, 400),
    ("float16 bytes", "/pooling", {"model": MINILM, "input": "a", "embed_dtype": "float16"}, 422),
    ("a task not served", "/pooling", {"model": MINILM, "input": "a", "task": "classify"}, 422),
    (
        "rerank cut at k tokens",
        "/v1/rerank",
        {"model": "ce", "query": "a", "documents": ["b"], "truncate_prompt_tokens": 5},
        400,
    ),
    (
        "rerank of an object",
        "/v2/rerank",
        {"model": "ce", "query": "a", "documents": [{"text": "b"}], **VLLM_FIELD},
        422,
    ),
    ("rerank by a classifier", "/v2/rerank", {"model": "clf", "query": "a", "documents": ["b"], **VLLM_FIELD}, 400),
    (
        "rerank without special tokens",
        "/v1/rerank",
        {"model": "ce", "query": "a", "documents": ["b"], "add_special_tokens": False},
        400,
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "status"), BAD, ids=[c[0] for c in BAD])
def test_bad_vllm_requests_answer_in_the_openai_shape(
    dialect_server: LiveServer, case: str, path: str, body: dict[str, Any], status: int
) -> None:
    with dialect_server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_a_body_mixing_vllms_and_cohere_fields_is_a_422_naming_both(dialect_server: LiveServer, path: str) -> None:
    body = {"model": "ce", "query": "a", "documents": ["b"], "use_activation": False, "return_documents": True}
    with dialect_server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "use_activation"
    assert "use_activation" in error["message"]
    assert "return_documents" in error["message"]


def test_infinity_and_vllm_bodies_without_a_model_run_the_configured_default(dialect_server: LiveServer) -> None:
    from infinity_client import Client
    from infinity_client.api.default import embeddings, rerank
    from infinity_client.models import OpenAIEmbeddingInputText, OpenAIEmbeddingResult, RerankInput, ReRankResult

    with Client(base_url=dialect_server.url, timeout=None) as client:  # it sends "default/not-specified"
        vectors = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS))
        ranked = rerank.sync(client=client, body=RerankInput(query="guitar", documents=TEXTS))
    assert isinstance(vectors, OpenAIEmbeddingResult)
    assert isinstance(ranked, ReRankResult)
    assert isinstance(vectors.id, str)
    assert isinstance(vectors.created, int)  # Infinity's answer has both; OpenAI's neither
    named = post(dialect_server, "/embeddings", {"model": MINILM, "input": TEXTS})["data"]
    got = np.asarray([v.embedding for v in vectors.data], dtype=np.float64)
    np.testing.assert_allclose(got, [d["embedding"] for d in named], atol=1e-6)
    expected = rerank_scores(dialect_server, "ce", "guitar", TEXTS)
    assert [r.relevance_score for r in sorted(ranked.results, key=lambda r: r.index)] == pytest.approx(expected)
    pooled = post(dialect_server, "/pooling", {"input": TEXTS[0]})["data"][0]["data"]
    np.testing.assert_allclose(pooled, named[0]["embedding"], atol=1e-6)
    scored = post(dialect_server, "/score", {"text_1": "guitar", "text_2": TEXTS})["data"]
    assert [d["score"] for d in scored] == pytest.approx(expected, abs=1e-6)
    labels = post(dialect_server, "/classify", {"input": TEXTS[:1]})
    assert labels["model"] == "clf"
    assert labels["data"] == post(dialect_server, "/classify", {"model": "clf", "input": TEXTS[:1]})["data"]


def test_infinity_client_embeddings_and_rerank(dialect_server: LiveServer) -> None:
    from infinity_client import Client
    from infinity_client.api.default import embeddings, rerank
    from infinity_client.models import OpenAIEmbeddingInputText, OpenAIEmbeddingResult, RerankInput, ReRankResult

    with Client(base_url=dialect_server.url, timeout=None) as client:
        vectors = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model="dense"))
        ranked = rerank.sync(client=client, body=RerankInput(query="guitar", documents=TEXTS, model="ce"))
    expected = post(dialect_server, "/v1/embeddings", {"model": "dense", "input": TEXTS})["data"]
    assert isinstance(vectors, OpenAIEmbeddingResult)
    assert isinstance(ranked, ReRankResult)
    got = np.asarray([v.embedding for v in vectors.data], dtype=np.float64)
    np.testing.assert_allclose(got, np.asarray([e["embedding"] for e in expected]), atol=1e-6)
    scores = rerank_scores(dialect_server, "ce", "guitar", TEXTS)
    assert [r.index for r in ranked.results] == sorted(range(3), key=lambda i: -scores[i])


@pytest.mark.slow  # importing litellm takes about 5 s
def test_litellm_hosted_vllm_and_infinity_rerank_beside_infinity_client_on_one_server(
    dialect_server: LiveServer,
) -> None:
    """Each with its defaults (litellm asks for documents): `hosted_vllm/` at the server's `/v1`,
    reading `document.text`; `infinity/` and infinity_client at its root, reading the text itself."""
    import litellm
    from infinity_client import Client
    from infinity_client.api.default import rerank
    from infinity_client.models import RerankInput, ReRankResult

    with loopback_only() as attempts:
        vllm = litellm.rerank(
            model="hosted_vllm/ce", query="guitar", documents=TEXTS, api_base=f"{dialect_server.url}/v1"
        )
        infinity = litellm.rerank(model="infinity/ce", query="guitar", documents=TEXTS, api_base=dialect_server.url)
        with Client(base_url=dialect_server.url, timeout=None) as client:
            body = RerankInput(query="guitar", documents=TEXTS, model="ce", return_documents=True)
            own = rerank.sync(client=client, body=body)
    assert attempts == [], f"a client tried to leave the machine: {attempts}"
    scores = rerank_scores(dialect_server, "ce", "guitar", TEXTS)
    best_first = sorted(range(3), key=lambda i: -scores[i])
    for answer in (vllm, infinity):
        assert answer.results is not None
        assert [r["index"] for r in answer.results] == best_first
        assert [r["document"]["text"] for r in answer.results] == [TEXTS[i] for i in best_first]
        assert [r["relevance_score"] for r in answer.results] == pytest.approx(
            [scores[i] for i in best_first], abs=1e-6
        )
    assert isinstance(own, ReRankResult)
    assert [r.index for r in own.results] == best_first
    assert [r.document for r in own.results] == [TEXTS[i] for i in best_first]  # Infinity's: the text itself


def test_models_lists_kind_and_capabilities_before_loading(serve: Any, dialect_models: dict[str, Path]) -> None:
    server = serve({"models": [{"name": n, "source": str(p)} for n, p in dialect_models.items()]})
    with server.client() as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {n: m["status"] for n, m in listed.items()} == dict.fromkeys(dialect_models, "unloaded")
    assert {n: (m["kind"], m["capabilities"]) for n, m in listed.items()} == {
        "dense": ("dense", ["embed_text"]),
        "ce": ("reranker", ["rerank"]),
        "clf": ("classifier", ["classify"]),
        "splade": ("sparse", ["sparse"]),
        "colbert": ("multivector", ["multivector"]),
        "clip": ("image_text", ["embed_image", "embed_text"]),
    }
