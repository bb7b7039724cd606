"""Classification, the Cohere rerank shape, dense reranking by the model's declared similarity
function and the official clients against the zoo models."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_bge_m3, tiny_cross_encoder

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "The stock market fell sharply on Monday.", "hello world"]
QUERY = "A man is playing a guitar."
DOCUMENTS = [
    "A man plays the guitar on the stage.",
    "Stocks fell.",
    "A dog runs in the snow.",
    "hello world, this is a test of the tokenizer!",
    "The cat sleeps on the warm windowsill.",
    "What is the capital of France?",
]
#: Dense models without a Normalize module (so a dot product is not a cosine): the
#: `similarity_fn_name` each declares (None: no key, which means cosine) and its `truncate_dim`.
DECLARED: dict[str, tuple[str | None, int | None]] = {
    "st-dot": ("dot", None),
    "st-euclidean": ("euclidean", None),
    "st-manhattan": ("manhattan", None),
    "st-absent": (None, None),
    "st-dot-8": ("dot", 8),  # scored on the vectors as served: their first 8 components
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo")
    return {
        "ce": tiny_cross_encoder(root / "ce"),
        "clf": tiny_cross_encoder(root / "clf", labels=3, seed=1),
        "m3": tiny_bge_m3(root / "m3"),
        "dense": tiny_bert(root / "dense"),
        **{
            name: tiny_bert(root / name, normalize=False, similarity=fn, truncate_dim=dim)
            for name, (fn, dim) in DECLARED.items()
        },
    }


@pytest.fixture
def server(serve: Any, zoo: dict[str, Path]) -> Any:
    return serve({"models": [{"name": name, "source": str(path), "backend": "torch"} for name, path in zoo.items()]})


def test_classifier_equals_softmax_of_transformers_logits(server: Any, zoo: dict[str, Path]) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(zoo["clf"]))
    model = AutoModelForSequenceClassification.from_pretrained(str(zoo["clf"])).eval()
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits
    probabilities = torch.softmax(logits, dim=-1).numpy()
    names = [model.config.id2label[i] for i in range(3)]
    with server.client() as client:
        body = client.post("/classify", json={"model": "clf", "input": TEXTS}).json()
        raw = client.post("/classify", json={"model": "clf", "input": TEXTS, "raw_scores": True}).json()
        single = [client.post("/classify", json={"model": "clf", "input": t}).json()["data"][0] for t in TEXTS]
        wrong = client.post("/classify", json={"model": "ce", "input": TEXTS})
    assert body["object"] == "classify"
    for i, row in enumerate(body["data"]):
        scores = [r["score"] for r in row]
        assert scores == sorted(scores, reverse=True)
        got = {r["label"]: r["score"] for r in row}
        np.testing.assert_allclose([got[n] for n in names], probabilities[i], atol=1e-5)
        got_raw = {r["label"]: r["score"] for r in raw["data"][i]}
        np.testing.assert_allclose([got_raw[n] for n in names], logits[i].numpy(), atol=1e-5)
        alone = {r["label"]: r["score"] for r in single[i]}
        np.testing.assert_allclose([alone[n] for n in names], [got[n] for n in names], atol=1e-5)
    assert wrong.status_code == 400
    assert "rerank" in wrong.json()["error"]["message"]


def test_cohere_shape_and_client(server: Any) -> None:
    import cohere

    documents = ["A man plays the guitar.", "Stocks fell.", "A dog runs in the snow."]
    with server.client() as client:
        v1 = client.post(
            "/v1/rerank",
            json={"model": "ce", "query": "guitar", "documents": [{"text": d} for d in documents], "top_n": 2},
        ).json()
        v2 = client.post("/v2/rerank", json={"model": "ce", "query": "guitar", "documents": documents}).json()
        infinity = client.post("/rerank", json={"model": "ce", "query": "guitar", "documents": documents}).json()
        bad = client.post("/v2/rerank", json={"model": "ce", "query": "guitar", "documents": [{"title": "x"}]})
    assert len(v1["results"]) == 2
    assert v1["results"][0]["document"] == {"text": documents[v1["results"][0]["index"]]}
    assert "document" not in v2["results"][0]
    assert v2["meta"]["scoring_method"] == "cross-encoder"
    assert [r["index"] for r in v2["results"]] == [r["index"] for r in infinity["results"]]
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "documents"

    with httpx.Client(timeout=60) as http:
        v2_client = cohere.ClientV2(api_key="unused", base_url=server.url, httpx_client=http)
        answer = v2_client.rerank(model="ce", query="guitar", documents=documents, top_n=3)
        v1_client = cohere.Client(api_key="unused", base_url=server.url, httpx_client=http)
        old = v1_client.rerank(model="ce", query="guitar", documents=documents, return_documents=True)
    assert [r.index for r in answer.results] == [r["index"] for r in infinity["results"]]
    np.testing.assert_allclose(
        [r.relevance_score for r in answer.results], [r["relevance_score"] for r in infinity["results"]], atol=1e-6
    )
    assert old.results[0].document is not None
    assert old.results[0].document.text == documents[old.results[0].index]


def test_rerank_with_a_dense_model_uses_cosine(server: Any) -> None:
    documents = ["A man plays the guitar.", "Stocks fell.", "A dog runs in the snow."]
    with server.client() as client:
        ranked = client.post("/rerank", json={"model": "dense", "query": "guitar", "documents": documents}).json()
        vectors = client.post("/v1/embeddings", json={"model": "dense", "input": ["guitar", *documents]}).json()
    assert ranked["meta"]["scoring_method"] == "cosine"
    matrix = np.asarray([d["embedding"] for d in vectors["data"]])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    expected = matrix[1:] @ matrix[0]
    for result in ranked["results"]:
        assert result["relevance_score"] == pytest.approx(float(expected[result["index"]]), abs=1e-5)


def reference(directory: Path, cosine: bool = False) -> tuple[str, np.ndarray]:
    """sentence-transformers' own scores of DOCUMENTS against QUERY on the model's files (cosine
    whatever the model declares, with `cosine`), and the function it used."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import cos_sim

    model = SentenceTransformer(str(directory), device="cpu")
    query, documents = model.encode([QUERY]), model.encode(DOCUMENTS)
    scores = (cos_sim if cosine else model.similarity)(query, documents)
    return ("cosine" if cosine else model.similarity_fn_name), scores.numpy()[0]


def by_index(results: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The order of the results and each document's score, in the documents' order."""
    scores = {r["index"]: r[key] for r in results}
    return [r["index"] for r in results], [scores[i] for i in range(len(DOCUMENTS))]


@pytest.mark.parametrize("name", DECLARED)
def test_dense_rerank_scores_by_the_models_declared_similarity(server: Any, zoo: dict[str, Path], name: str) -> None:
    fn, expected = reference(zoo[name])
    assert fn == (DECLARED[name][0] or "cosine")  # the library read the files as the server does
    if fn != "cosine":  # these vectors' cosines are other scores: the test tells the two apart
        assert np.abs(expected - reference(zoo[name], cosine=True)[1]).max() > 0.1
    body = {"model": name, "query": QUERY}
    with server.client() as client:
        infinity = client.post("/rerank", json={**body, "documents": DOCUMENTS}).json()
        cohere = client.post("/v2/rerank", json={**body, "documents": DOCUMENTS}).json()
        tei = client.post("/rerank", json={**body, "texts": DOCUMENTS}).json()
        details = client.get(f"/v1/models/{name}").json()["details"]
    for results, key in (
        (infinity["results"], "relevance_score"),
        (cohere["results"], "relevance_score"),
        (tei, "score"),
    ):
        order, got = by_index(results, key)
        np.testing.assert_allclose(got, expected, atol=1e-4)
        # best first by the library's scores (two within the tolerance may come either way)
        assert all(expected[a] >= expected[b] - 1e-4 for a, b in pairwise(order))
    assert infinity["meta"]["scoring_method"] == cohere["meta"]["scoring_method"] == fn
    assert details["similarity_fn_name"] == fn


def test_routes_that_define_cosine_keep_it_whatever_the_model_declares(server: Any, zoo: dict[str, Path]) -> None:
    """TEI's /similarity, vLLM's /score and vLLM's rerank score embeddings by cosine in those projects."""
    _, expected = reference(zoo["st-dot"], cosine=True)
    with server.client() as client:
        similarity = client.post(
            "/similarity", json={"model": "st-dot", "inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}}
        ).json()
        score = client.post("/v1/score", json={"model": "st-dot", "text_1": QUERY, "text_2": DOCUMENTS}).json()
        vllm = client.post(
            "/v1/rerank", json={"model": "st-dot", "query": QUERY, "documents": DOCUMENTS, "use_activation": True}
        ).json()
    np.testing.assert_allclose(similarity, expected, atol=1e-4)
    np.testing.assert_allclose([d["score"] for d in score["data"]], expected, atol=1e-4)
    np.testing.assert_allclose(by_index(vllm["results"], "relevance_score")[1], expected, atol=1e-4)


def test_openai_client_embeds_with_a_multi_output_model(server: Any) -> None:
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client:
        answer = client.embeddings.create(model="m3", input=TEXTS)  # the client asks for base64
        with pytest.raises(openai.BadRequestError, match="capabilities"):
            client.embeddings.create(model="ce", input=TEXTS)
    with server.client() as http:
        encoded = http.post("/v1/encode", json={"model": "m3", "input": TEXTS, "outputs": ["dense"]}).json()["data"]
    for got, expected in zip(answer.data, encoded, strict=True):
        np.testing.assert_allclose(got.embedding, expected["dense"], atol=1e-6)


def test_a_broken_model_does_not_take_down_the_others(serve: Any, zoo: dict[str, Path], tmp_path: Path) -> None:
    from tests.builders.zoo import tiny_colbert

    broken = tiny_colbert(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"not a checkpoint")
    server = serve(
        {
            "models": [
                {"name": "clf-as-reranker", "source": str(zoo["clf"]), "kind": "reranker", "backend": "torch"},
                {"name": "broken", "source": str(broken), "backend": "torch"},
                {"name": "ce", "source": str(zoo["ce"]), "backend": "torch"},
            ]
        }
    )
    with server.client() as client:
        wrong = client.post("/rerank", json={"model": "clf-as-reranker", "query": "q", "documents": ["a"]})
        dead = client.post("/v1/encode", json={"model": "broken", "input": ["a"], "outputs": ["multivector"]})
        fine = client.post("/rerank", json={"model": "ce", "query": "q", "documents": ["a"]})
    assert wrong.status_code == 503
    assert "kind: classifier" in wrong.json()["error"]["message"]
    assert dead.status_code == 503
    assert fine.status_code == 200
