"""Hybrid rerank (`weights`, `return_parts`) on Cohere's and TEI's rerank routes: on BGE-M3 each
ranks as Infinity's `POST /rerank` does, shows the same parts, and refuses bad weights in its own
error shape."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.builders.zoo import tiny_bge_m3
from tests.conftest import LiveServer, start_server
from tests.integration.dialects.clients import loopback_only

pytestmark = pytest.mark.integration

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Two dogs are running through the snow!",
    "The cat sleeps on the warm windowsill.",
    "France borders Spain, and its capital is Paris.",
]
#: Each dialect's rerank: its path, its documents' field, and its result's score field.
ROUTES = {
    "cohere-v1": ("/v1/rerank", "documents", "relevance_score"),
    "cohere-v2": ("/v2/rerank", "documents", "relevance_score"),
    "tei": ("/rerank", "texts", "score"),
}


@pytest.fixture(scope="module")
def m3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """BGE-M3 (three outputs) beside a model with one output."""
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    m3 = tiny_bge_m3(tmp_path_factory.mktemp("m3") / "m3")
    entries = [
        {"name": "m3", "source": str(m3), "backend": "torch"},
        {"name": "fake", "source": "fake", "kind": "fake"},
    ]
    live = start_server(create_app(Settings(ServerSettings(), registry_config({"models": entries}))))
    yield live
    live.close()


def dialect_rerank(server: LiveServer, route: str, model: str = "m3", **extra: Any) -> httpx.Response:
    path, documents, _ = ROUTES[route]
    with server.client() as client:
        return client.post(path, json={"model": model, "query": QUERY, documents: DOCUMENTS, **extra})


def infinity_rerank(server: LiveServer, model: str = "m3", **extra: Any) -> httpx.Response:
    with server.client() as client:
        return client.post("/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS, **extra})


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(
    "weights",
    [None, {"dense": 1.0, "sparse": 0.3, "multivector": 1.0}, {"sparse": 2.5}, {"dense": 0, "multivector": 0}],
)
def test_a_dialect_ranks_and_parts_as_infinity_s_rerank(
    m3_server: LiveServer, route: str, weights: dict[str, float] | None
) -> None:
    extra: dict[str, Any] = {"return_parts": True} if weights is None else {"weights": weights, "return_parts": True}
    expected = infinity_rerank(m3_server, **extra)
    answer = dialect_rerank(m3_server, route, **extra)
    assert expected.status_code == 200, expected.text
    assert answer.status_code == 200, answer.text
    reference = expected.json()["results"]
    results = answer.json() if route == "tei" else answer.json()["results"]
    score = ROUTES[route][2]
    assert [r["index"] for r in results] == [r["index"] for r in reference]
    assert [r[score] for r in results] == pytest.approx([r["relevance_score"] for r in reference], abs=1e-6)
    for got, want in zip(results, reference, strict=True):
        assert got["parts"] == pytest.approx(want["parts"], abs=1e-6)
        assert set(got["parts"]) == {"dense", "sparse", "multivector"}
    if route != "tei":
        assert answer.json()["meta"]["scoring_method"] == "hybrid"


@pytest.mark.parametrize("route", list(ROUTES))
def test_weights_without_return_parts_rank_without_parts(m3_server: LiveServer, route: str) -> None:
    weights = {"dense": 1.0, "sparse": 0.0, "multivector": 0.0}
    expected = infinity_rerank(m3_server, weights=weights).json()["results"]
    plain = dialect_rerank(m3_server, route).json()
    answer = dialect_rerank(m3_server, route, weights=weights).json()
    results = answer if route == "tei" else answer["results"]
    score = ROUTES[route][2]
    assert all("parts" not in r for r in results)
    assert [r[score] for r in results] == pytest.approx([r["relevance_score"] for r in expected], abs=1e-6)
    if route != "tei":  # without weights, the model's own method (MaxSim) ranks
        assert answer["meta"]["scoring_method"] == "hybrid"
        assert plain["meta"]["scoring_method"] == "maxsim"


BAD: dict[str, tuple[str, dict[str, Any]]] = {
    "negative": ("m3", {"weights": {"sparse": -0.5}}),
    "huge": ("m3", {"weights": {"dense": 1e308, "sparse": 1e308, "multivector": 1e308}}),
    "all zero": ("m3", {"weights": {"dense": 0, "sparse": 0, "multivector": 0}}),
    "unknown part": ("m3", {"weights": {"colbert": 1}}),
    "one output": ("fake", {"weights": {}}),
    "parts of one output": ("fake", {"return_parts": True}),
}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", list(BAD))
def test_bad_weights_get_infinity_s_status_in_the_dialect_s_shape(m3_server: LiveServer, route: str, case: str) -> None:
    model, extra = BAD[case]
    expected = infinity_rerank(m3_server, model, **extra)
    answer = dialect_rerank(m3_server, route, model, **extra)
    assert 400 <= expected.status_code < 500, expected.text
    assert answer.status_code == expected.status_code, answer.text
    want = expected.json()["error"]
    if route == "tei":
        assert answer.json() == {"error": want["message"], "error_type": "Validation"}
    else:
        assert answer.json() == {"error": want}
        assert want["param"] == "weights"
    with m3_server.client() as client:
        assert client.get("/health").status_code == 200


def test_the_infinity_route_refuses_negative_and_all_zero_weights(m3_server: LiveServer) -> None:
    negative = infinity_rerank(m3_server, weights={"sparse": -0.5})
    zero = infinity_rerank(m3_server, weights={"dense": 0, "sparse": 0, "multivector": 0})
    assert negative.status_code == 400
    assert negative.json()["error"]["message"] == "weights.sparse must be from 0 to 1000, got -0.5"
    assert zero.status_code == 400
    assert "all 0" in zero.json()["error"]["message"]


def test_weights_that_would_overflow_the_sum_are_refused_not_ranked_first(m3_server: LiveServer) -> None:
    """1e308 each: the weighted sums overflow to infinity; a score is finite or never answered."""
    huge = infinity_rerank(m3_server, weights={"dense": 1e308, "sparse": 1e308, "multivector": 1e308})
    assert huge.status_code == 400, huge.text
    assert huge.json()["error"]["message"] == "weights.dense must be from 0 to 1000, got 1e+308"
    at_bound = infinity_rerank(m3_server, weights={"dense": 1000, "sparse": 1000, "multivector": 1000})
    assert at_bound.status_code == 200, at_bound.text
    assert all(math.isfinite(r["relevance_score"]) for r in at_bound.json()["results"])


def test_the_cohere_sdk_reads_a_hybrid_answer(m3_server: LiveServer) -> None:
    import cohere

    options: Any = {"additional_body_parameters": {"weights": {"sparse": 1.0}, "return_parts": True}}
    expected = infinity_rerank(m3_server, weights={"sparse": 1.0}, return_parts=True).json()["results"]
    with loopback_only() as attempts, httpx.Client(timeout=60) as http:
        v2 = cohere.ClientV2(api_key="unused", base_url=m3_server.url, httpx_client=http)
        v1 = cohere.Client(api_key="unused", base_url=m3_server.url, httpx_client=http)
        answers: list[Any] = [
            v2.rerank(model="m3", query=QUERY, documents=DOCUMENTS, request_options=options),
            v1.rerank(model="m3", query=QUERY, documents=DOCUMENTS, request_options=options),
        ]
    assert attempts == []
    for answer in answers:
        assert [r.index for r in answer.results] == [r["index"] for r in expected]
        assert [r.relevance_score for r in answer.results] == pytest.approx(
            [r["relevance_score"] for r in expected], abs=1e-6
        )
        parts = [getattr(r, "parts", None) for r in answer.results]
        assert parts == [pytest.approx(r["parts"], abs=1e-6) for r in expected]


def test_the_api_document_lists_the_hybrid_fields(m3_server: LiveServer) -> None:
    with m3_server.client() as client:
        document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    for name in ("CohereRerankRequest", "TeiRerankRequest", "RerankRequest"):
        assert {"weights", "return_parts"} <= schemas[name]["properties"].keys(), name
