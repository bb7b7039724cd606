"""Hybrid rerank on BGE-M3: the fused score is the weighted sum of the parts `/v1/encode` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import InvalidInput, UnsupportedOperation
from model_registry.tasks.rerank import PUBLISHED_WEIGHTS, hybrid_weights
from model_registry.types import Capability, Output
from tests.builders.zoo import tiny_bge_m3

pytestmark = pytest.mark.integration

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Two dogs are running through the snow!",
    "The cat sleeps on the warm windowsill.",
    "France borders Spain, and its capital is Paris.",
]


def parts_from_encode(client: Any) -> list[dict[str, float]]:
    """Each document's dense cosine, sparse dot product and MaxSim averaged over query tokens,
    computed here from `/v1/encode`'s three outputs."""
    body = {"model": "m3", "input": [QUERY, *DOCUMENTS], "outputs": ["dense", "sparse", "multivector"]}
    response = client.post("/v1/encode", json=body)
    assert response.status_code == 200, response.text
    query, *documents = response.json()["data"]
    q_dense, q_vectors = np.asarray(query["dense"], np.float64), np.asarray(query["multivector"], np.float64)
    q_sparse = dict(zip(query["sparse"]["indices"], query["sparse"]["values"], strict=True))
    found = []
    for document in documents:
        dense = np.asarray(document["dense"], np.float64)
        sparse = dict(zip(document["sparse"]["indices"], document["sparse"]["values"], strict=True))
        vectors = np.asarray(document["multivector"], np.float64)
        found.append(
            {
                "dense": float(q_dense @ dense / np.linalg.norm(q_dense) / np.linalg.norm(dense)),
                "sparse": sum(v * sparse.get(k, 0.0) for k, v in q_sparse.items()),
                "multivector": float((q_vectors @ vectors.T).max(axis=1).mean()),
            }
        )
    return found


def rerank(client: Any, **extra: Any) -> Any:
    response = client.post("/rerank", json={"model": "m3", "query": QUERY, "documents": DOCUMENTS, **extra})
    return response


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bge_m3(tmp_path_factory.mktemp("m3") / "m3")


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (None, {"dense": 0.4, "sparse": 0.2, "multivector": 0.4}),  # the authors' published weights
        ({"dense": 1.0, "sparse": 0.3, "multivector": 1.0}, {"dense": 1.0, "sparse": 0.3, "multivector": 1.0}),
        ({"sparse": 2.5}, {"dense": 0.4, "sparse": 2.5, "multivector": 0.4}),  # the others: the defaults
    ],
)
def test_the_fused_score_is_the_weighted_sum_of_the_encoded_parts(
    serve: Any, m3_dir: Path, weights: dict[str, float] | None, expected: dict[str, float]
) -> None:
    server = serve({"models": [{"name": "m3", "source": str(m3_dir), "backend": "torch"}]})
    with server.client() as client:
        reference = parts_from_encode(client)
        extra: dict[str, Any] = {"return_parts": True}
        if weights is not None:
            extra["weights"] = weights
        response = rerank(client, **extra)
    assert response.status_code == 200, response.text
    ranked = response.json()
    assert ranked["meta"]["scoring_method"] == "hybrid"
    scores = [r["relevance_score"] for r in ranked["results"]]
    assert scores == sorted(scores, reverse=True)
    for result in ranked["results"]:
        parts = reference[result["index"]]
        fused = sum(expected[name] * parts[name] for name in expected)
        assert result["relevance_score"] == pytest.approx(fused, abs=1e-5)
        assert result["parts"] == pytest.approx(parts, abs=1e-5)


def test_parts_are_shown_only_on_request_and_weights_are_checked(serve: Any, m3_dir: Path, tmp_path: Path) -> None:
    server = serve({"models": [{"name": "m3", "source": str(m3_dir), "backend": "torch"}, fake_entry()]})
    with server.client() as client:
        reference = parts_from_encode(client)
        fused = rerank(client, weights={"dense": 1, "sparse": 0, "multivector": 0}).json()
        misspelt = rerank(client, weights={"colbert": 1})
        infinite = client.post(
            "/rerank",
            content=b'{"model": "m3", "query": "q", "documents": ["d"], "weights": {"dense": Infinity}}',
            headers={"content-type": "application/json"},
        )
        one_output = client.post("/rerank", json={"model": "fake", "query": "q", "documents": ["d"], "weights": {}})
        plain = rerank(client).json()
        assert client.get("/health").status_code == 200
    for result in fused["results"]:
        assert "parts" not in result
        assert result["relevance_score"] == pytest.approx(reference[result["index"]]["dense"], abs=1e-5)
    assert misspelt.status_code in (400, 422)
    assert "colbert" in misspelt.text
    assert infinite.status_code in (400, 422)
    assert one_output.status_code == 400
    assert "weights" in one_output.text
    assert plain["meta"]["scoring_method"] == "maxsim"  # without weights, rerank is unchanged


def fake_entry() -> dict[str, Any]:
    return {"name": "fake", "source": "fake", "kind": "fake"}


def test_an_entry_s_rerank_weights_are_its_defaults_under_the_request_s() -> None:
    every = frozenset({Capability.EMBED_TEXT, Capability.SPARSE, Capability.MULTIVECTOR})
    assert hybrid_weights(every, "m3", None, None) == dict(PUBLISHED_WEIGHTS)
    own = {"dense": 1.0, "sparse": 0.0, "multivector": 0.5}
    assert hybrid_weights(every, "m3", {"sparse": 0.3, "dense": None}, own) == {
        Output.DENSE: 1.0,
        Output.SPARSE: 0.3,
        Output.MULTIVECTOR: 0.5,
    }
    two = frozenset({Capability.EMBED_TEXT, Capability.MULTIVECTOR})
    assert hybrid_weights(two, "m", {"sparse": 0}, None) == {Output.DENSE: 0.4, Output.MULTIVECTOR: 0.4}
    with pytest.raises(UnsupportedOperation, match="no sparse output"):
        hybrid_weights(two, "m", {"sparse": 1}, None)
    with pytest.raises(InvalidInput, match=r"weights\.dense must be from 0 to 1000, got -1"):
        hybrid_weights(every, "m3", {"dense": -1}, None)
    with pytest.raises(InvalidInput, match=r"\(dense: 0, multivector: 0\) are all 0"):
        hybrid_weights(two, "m", {"dense": 0, "multivector": 0.0}, None)
