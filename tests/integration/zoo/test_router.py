"""sentence-transformers Router models over HTTP, against `encode_query` / `encode_document`.

An inference-free sparse model (an IDF table for queries, SPLADE for documents, in the published
layout and in the one sentence-transformers 6 saves) and a dense Router (StaticEmbedding queries,
a transformer's documents, then Normalize). The side is picked by the field that picks a prompt
(`prompt_name`, Cohere's `input_type`, TEI's `prompt_name`), else the Router's default route;
`/rerank` scores a query on its side against documents on theirs. Routes the server cannot serve,
or that disagree, are start-up errors naming what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import ModelUnavailable, SyncRegistry
from tests.builders.routers import tiny_dense_router, tiny_inference_free_sparse

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5
TEXTS = [
    "What is the capital of France?",
    "The cat sleeps on the warm windowsill.",
    "Two dogs are running through the snow, barking at every passing car!",
]
QUERY = "Which animal sleeps on the windowsill?"
LAYOUTS: dict[str, Callable[[Path], Path]] = {
    "published": tiny_inference_free_sparse,
    "sentence-transformers 6": partial(tiny_inference_free_sparse, published=False),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("routers")
    models = {name: build(root / str(i)) for i, (name, build) in enumerate(LAYOUTS.items())}
    models["dense"] = tiny_dense_router(root / "dense")
    return models


def sparse_reference(directory: Path, side: str, texts: list[str]) -> list[dict[int, float]]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(directory), device="cpu")
    encode = {"query": model.encode_query, "document": model.encode_document, "default": model.encode}[side]
    rows = encode(texts).to_dense().numpy()
    return [{int(i): float(row[i]) for i in np.flatnonzero(row)} for row in rows]


def assert_sparse_equal(got: list[dict[int, float]], want: list[dict[int, float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), f"terms differ: {sorted(set(g) ^ set(w))[:10]}"
        assert max(abs(g[k] - w[k]) for k in w) < TOLERANCE


def encode_sparse(client: Any, texts: list[str], **extra: Any) -> list[dict[int, float]]:
    answer = client.post("/v1/encode", json={"model": "m", "input": texts, "outputs": ["sparse"], **extra})
    assert answer.status_code == 200, answer.text
    return [dict(zip(r["sparse"]["indices"], r["sparse"]["values"], strict=True)) for r in answer.json()["data"]]


def tei_sparse(client: Any, texts: list[str], **extra: Any) -> list[dict[int, float]]:
    answer = client.post("/embed_sparse", json={"model": "m", "inputs": texts, **extra})
    assert answer.status_code == 200, answer.text
    return [{e["index"]: e["value"] for e in row} for row in answer.json()]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_field_that_picks_a_prompt_picks_the_side(serve: Any, built: dict[str, Path], layout: str) -> None:
    directory = built[layout]
    query, document = sparse_reference(directory, "query", TEXTS), sparse_reference(directory, "document", TEXTS)
    # a query weighs the tokens it holds; a document, the MLM's expansion over the vocabulary
    assert all(0 < len(q) < len(d) for q, d in zip(query, document, strict=True))
    assert sparse_reference(directory, "default", TEXTS) == document, "the reference's default is the document side"
    live = serve({"models": [{"name": "m", "source": str(directory)}]})
    with live.client() as client:
        asked = {
            "prompt_name query": encode_sparse(client, TEXTS, prompt_name="query"),
            "task query": encode_sparse(client, TEXTS, task="query"),
            "TEI prompt_name query": tei_sparse(client, TEXTS, prompt_name="query"),
            "no field": encode_sparse(client, TEXTS),
            "prompt_name document": encode_sparse(client, TEXTS, prompt_name="document"),
            "prompt_name passage": encode_sparse(client, TEXTS, prompt_name="passage"),
            "TEI, no field": tei_sparse(client, TEXTS),
        }
        details = client.get("/v1/models/m").json()
        alone = [encode_sparse(client, [text], prompt_name=side)[0] for side in ("query", "document") for text in TEXTS]
    for name, got in asked.items():
        assert_sparse_equal(got, query if "query" in name else document)
    assert_sparse_equal(alone, query + document)  # each text asked alone, as in the batch
    router = details["details"]["router"]
    assert (router["default_route"], sorted(router["routes"])) == ("document", ["document", "query"])
    assert router["routes"]["query"]["engine"]["backend"] == "numpy"
    assert details["backend"] == router["routes"]["document"]["engine"]["backend"] != "numpy"


def test_a_batch_of_both_sides_equals_each_side_alone(serve: Any, built: dict[str, Path]) -> None:
    """Queries and documents asked at once (the queue keeps the routes in separate batches)."""
    import asyncio

    import httpx

    directory = built["published"]
    live = serve({"models": [{"name": "m", "source": str(directory)}]})

    async def both() -> list[Any]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            bodies = [{"prompt_name": "query"} if i % 2 else {} for i in range(8)]
            calls = [
                client.post("/v1/encode", json={"model": "m", "input": TEXTS, "outputs": ["sparse"], **b})
                for b in bodies
            ]
            return list(await asyncio.gather(*calls))

    answers = asyncio.run(both())
    query, document = sparse_reference(directory, "query", TEXTS), sparse_reference(directory, "document", TEXTS)
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        rows = answer.json()["data"]
        got = [dict(zip(r["sparse"]["indices"], r["sparse"]["values"], strict=True)) for r in rows]
        assert_sparse_equal(got, query if i % 2 else document)


def test_rerank_scores_an_idf_query_against_splade_documents(serve: Any, built: dict[str, Path]) -> None:
    from sentence_transformers import SparseEncoder

    directory = built["published"]
    model = SparseEncoder(str(directory), device="cpu")
    expected = model.similarity(model.encode_query([QUERY]), model.encode_document(TEXTS)).numpy()[0]
    live = serve({"models": [{"name": "m", "source": str(directory)}]})
    with live.client() as client:
        answer = client.post("/rerank", json={"model": "m", "query": QUERY, "documents": TEXTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    got = np.asarray([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))


def test_a_dense_router_answers_each_side_and_cohere_input_type_picks_it(serve: Any, built: dict[str, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    directory = built["dense"]
    model = SentenceTransformer(str(directory), device="cpu")
    query, document = model.encode_query(TEXTS), model.encode_document(TEXTS)
    assert np.abs(query - document).max() > 0.1, "the two routes answer apart"
    live = serve({"models": [{"name": "m", "source": str(directory)}]})
    with live.client() as client:
        cohere = {
            kind: client.post("/v1/embed", json={"model": "m", "texts": TEXTS, "input_type": kind})
            for kind in ("search_query", "search_document")
        }
        plain = client.post("/v1/embeddings", json={"model": "m", "input": TEXTS})
        short = client.post("/v1/embeddings", json={"model": "m", "input": TEXTS, "dimensions": 8})
    for answer in (*cohere.values(), plain, short):
        assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(cohere["search_query"].json()["embeddings"], query, atol=TOLERANCE)
    np.testing.assert_allclose(cohere["search_document"].json()["embeddings"], document, atol=TOLERANCE)
    np.testing.assert_allclose([r["embedding"] for r in plain.json()["data"]], document, atol=TOLERANCE)
    cut = document[:, :8] / np.linalg.norm(document[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose([r["embedding"] for r in short.json()["data"]], cut, atol=TOLERANCE)


def _edit(directory: Path, name: str, change: Callable[[Any], Any]) -> None:
    path = directory / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _copy(built: dict[str, Path], tmp_path: Path, name: str = "published") -> Path:
    import shutil

    return Path(shutil.copytree(built[name], tmp_path / "m"))


def _load(directory: Path) -> None:
    with SyncRegistry.from_config({"models": [{"name": "m", "source": str(directory)}]}) as registry:
        registry.embed("m", TEXTS, outputs=["sparse"])


def test_a_route_with_a_module_not_served_is_refused_naming_it(built: dict[str, Path], tmp_path: Path) -> None:
    directory = _copy(built, tmp_path)
    autoencoder = "sentence_transformers.sparse_encoder.models.SparseAutoEncoder"

    def add(config: dict[str, Any]) -> dict[str, Any]:
        config["types"]["document_2_SparseAutoEncoder"] = autoencoder
        config["structure"]["document"].append("document_2_SparseAutoEncoder")
        return config

    _edit(directory, "router_config.json", add)
    with pytest.raises(ModelUnavailable, match=r"'document' route cannot be served.*SparseAutoEncoder module"):
        _load(directory)


def test_routes_of_different_kinds_are_refused(built: dict[str, Path], tmp_path: Path) -> None:
    directory = _copy(built, tmp_path)
    static = "sentence_transformers.models.StaticEmbedding"

    def dense_queries(config: dict[str, Any]) -> dict[str, Any]:
        config["types"]["query_0_SparseStaticEmbedding"] = static
        return config

    _edit(directory, "router_config.json", dense_queries)
    with pytest.raises(ModelUnavailable, match="routes are of different kinds \\('query' dense, 'document' sparse\\)"):
        _load(directory)


def test_a_route_mapping_for_images_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    directory = _copy(built, tmp_path)

    def images(config: dict[str, Any]) -> dict[str, Any]:
        config["parameters"]["route_mappings"] = {"(None, 'image')": "document"}
        return config

    _edit(directory, "router_config.json", images)
    with pytest.raises(ModelUnavailable, match="maps the modality 'image' to its 'document' route"):
        _load(directory)


def test_without_a_default_route_a_request_must_name_its_side(
    serve: Any, built: dict[str, Path], tmp_path: Path
) -> None:
    directory = _copy(built, tmp_path)

    def no_default(config: dict[str, Any]) -> dict[str, Any]:
        config["parameters"] = {"default_route": None, "allow_empty_key": False}
        return config

    _edit(directory, "router_config.json", no_default)
    live = serve({"models": [{"name": "m", "source": str(directory)}]})
    with live.client() as client:
        unnamed = client.post("/v1/encode", json={"model": "m", "input": TEXTS, "outputs": ["sparse"]})
        named = client.post(
            "/v1/encode", json={"model": "m", "input": TEXTS, "outputs": ["sparse"], "prompt_name": "document"}
        )
        assert client.get("/health").status_code == 200
    assert unnamed.status_code == 400, unnamed.text
    assert "no default route" in unnamed.json()["error"]["message"]
    assert named.status_code == 200, named.text
