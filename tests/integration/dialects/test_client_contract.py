"""What the client libraries rely on, over plain HTTP: null means the default, `dimensions` is
checked, one model by id, Infinity's model list, TEI's default model by kind, `top_k` on TEI's
classification, and a `/info` that never loads a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infinity_server.settings import ServerSettings, Settings, load_settings
from model_registry.config import registry_config
from model_registry.errors import ConfigError
from tests.conftest import LiveServer
from tests.integration.dialects.clients import openai_vectors
from tests.integration.dialects.conftest import MINILM, TEXTS, post

pytestmark = pytest.mark.integration

#: Each route with optional fields sent as `null`, as litellm, dspy and generated clients send them.
NULLS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"model": "dense", "input": TEXTS, "encoding_format": None, "dimensions": None, "user": None}),
    ("/embeddings", {"model": "dense", "input": TEXTS, "encoding_format": None, "embedding_type": None}),
    ("/v1/embed", {"model": "dense", "texts": TEXTS, "truncate": None, "embedding_types": None, "input_type": None}),
    ("/v2/rerank", {"model": "ce", "query": "q", "documents": TEXTS, "top_n": None, "return_documents": None}),
    ("/rerank", {"model": "ce", "query": "q", "documents": TEXTS, "return_documents": None, "raw_scores": None}),
    ("/embed", {"model": "dense", "inputs": TEXTS, "normalize": None, "truncation_direction": None}),
    ("/predict", {"model": "clf", "inputs": TEXTS[0], "raw_scores": None, "top_k": None, "parameters": None}),
    ("/v1/encode", {"model": "dense", "input": TEXTS, "outputs": None, "encoding_format": None}),
    ("/score", {"model": "ce", "text_1": "q", "text_2": TEXTS, "encoding_format": None}),
]


@pytest.mark.parametrize(("path", "body"), NULLS, ids=[n[0] for n in NULLS])
def test_null_means_the_default(dialect_server: LiveServer, path: str, body: dict[str, Any]) -> None:
    given = {k: v for k, v in body.items() if v is not None}
    assert _stable(post(dialect_server, path, body)) == _stable(post(dialect_server, path, given))


def _stable(answer: Any) -> Any:
    """An answer without what differs between two identical requests: its id and its time."""
    return {k: v for k, v in answer.items() if k not in ("id", "created")} if isinstance(answer, dict) else answer


def test_null_for_a_required_field_is_still_a_422(dialect_server: LiveServer) -> None:
    with dialect_server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "dense", "input": None})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "input"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"model": "dense", "input": TEXTS, "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"model": "dense", "input": TEXTS, "dimensions": -3}, "dimensions"),
        ("/embed", {"model": "dense", "inputs": TEXTS, "dimensions": 0}, "dimensions"),
        ("/v2/embed", {"model": "dense", "texts": TEXTS, "output_dimension": 0}, "output_dimension"),
        ("/embeddings", {"model": "dense", "input": TEXTS, "dimensions": -1}, "dimensions"),
    ],
)
def test_dimensions_below_one_are_a_400(
    dialect_server: LiveServer, path: str, body: dict[str, Any], param: str
) -> None:
    with dialect_server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if path == "/embed":  # TEI's shape: {"error": message, "error_type"}
        error = {"message": error, "param": param}
    assert error["param"] == param
    assert f"{param} must be" in error["message"]


def test_dimensions_above_the_model_name_both(dialect_server: LiveServer) -> None:
    width = len(openai_vectors(dialect_server, MINILM, TEXTS[:1])[0])
    with dialect_server.client() as client:
        response = client.post("/v1/embeddings", json={"model": MINILM, "input": TEXTS, "dimensions": width + 1})
    assert response.status_code == 400
    assert f"between 1 and {width}" in response.json()["error"]["message"]
    assert str(width + 1) in response.json()["error"]["message"]


def test_infinity_path_reads_dimensions_0_as_the_whole_vector(dialect_server: LiveServer) -> None:
    whole = post(dialect_server, "/embeddings", {"model": "dense", "input": TEXTS, "dimensions": 0})["data"]
    np.testing.assert_allclose([d["embedding"] for d in whole], openai_vectors(dialect_server, "dense", TEXTS))


def test_one_model_by_id_and_the_list_in_both_clients_shapes(dialect_server: LiveServer) -> None:
    with dialect_server.client() as client:
        listed = client.get("/v1/models").json()["data"]
        unversioned = client.get("/models").json()["data"]
        one = client.get("/v1/models/ce")
        unknown = client.get("/v1/models/nope")
    entry = one.json()
    assert one.status_code == 200
    assert {k: v for k, v in entry.items() if k != "last_used"} == next(
        {k: v for k, v in m.items() if k != "last_used"} for m in listed if m["id"] == "ce"
    )
    assert (entry["object"], entry["owned_by"], entry["kind"]) == ("model", "infinity", "reranker")
    for model in listed + unversioned:
        assert model["owned_by"] == "infinity"
        assert set(model["stats"]) == {"queue_depth", "queue_tokens"}
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.json()["error"]["param"] == "model"


# ---- TEI: which model, top_k, /info --------------------------------------------------------------


def test_tei_routes_without_a_model_take_the_only_one_that_can_serve_them(embedder_and_reranker: LiveServer) -> None:
    server = embedder_and_reranker
    embedded = post(server, "/embed", {"inputs": TEXTS})
    rooted = post(server, "/", {"inputs": TEXTS})
    ranked = post(server, "/rerank", {"query": "guitar", "texts": TEXTS})
    scored = post(server, "/predict", {"inputs": ["guitar", TEXTS[0]]})
    expected = post(server, "/rerank", {"model": "ce", "query": "guitar", "documents": TEXTS})["results"]
    np.testing.assert_allclose(embedded, openai_vectors(server, "dense", TEXTS), atol=1e-6)
    np.testing.assert_allclose(rooted, embedded, atol=1e-6)
    assert [r["index"] for r in ranked] == [r["index"] for r in expected]
    assert scored[0]["score"] == pytest.approx(next(r["relevance_score"] for r in expected if r["index"] == 0))


def test_two_models_that_can_serve_a_route_still_need_a_name(serve: Any, dialect_models: dict[str, Path]) -> None:
    models = [{"name": n, "source": str(dialect_models[s])} for n, s in (("a", "dense"), ("b", "dense"), ("r", "ce"))]
    server = serve({"models": models})
    with server.client() as client:
        response = client.post("/embed", json={"inputs": "a"})
        ranked = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert response.status_code == 400
    assert response.json()["error_type"] == "Validation"
    assert "2 of them can serve it (a, b)" in response.json()["error"]
    assert "server.default_models.embed" in response.json()["error"]
    assert ranked.status_code == 200


def test_default_models_naming_a_model_not_served_stops_the_start(
    serve: Any, dialect_models: dict[str, Path], tmp_path: Path
) -> None:
    models = [{"name": "dense", "source": str(dialect_models["dense"])}]
    with pytest.raises(ConfigError, match=r"server\.default_models\.rerank is 'nope'.*served models are: dense"):
        serve({"models": models}, default_models={"rerank": "nope"})
    config = tmp_path / "config.yaml"
    source = dialect_models["dense"]
    config.write_text(f"models: [{{name: dense, source: '{source}'}}]\nserver: {{default_models: {{predict: nope}}}}\n")
    with pytest.raises(ConfigError, match=r"server\.default_models\.predict"):
        load_settings(config, environ={})
    started = subprocess.run(
        [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert "server.default_models.predict is 'nope'" in started.stderr
    assert Settings(ServerSettings(default_models={"embed": "dense"}), registry_config({"models": models}))


def test_top_k_keeps_the_best_labels_on_predict_and_root(dialect_server: LiveServer) -> None:
    every = post(dialect_server, "/classify", {"model": "clf", "input": TEXTS})["data"]
    best_two = post(dialect_server, "/predict", {"model": "clf", "inputs": TEXTS[0], "top_k": 2})
    batch = post(dialect_server, "/predict", {"model": "clf", "inputs": [[t] for t in TEXTS], "top_k": 1})
    rooted = post(dialect_server, "/models/clf", {"inputs": TEXTS[0], "parameters": {"top_k": 1}})
    assert [p["label"] for p in best_two] == [c["label"] for c in every[0][:2]]
    assert [[p["label"] for p in row] for row in batch] == [[row[0]["label"]] for row in every]
    assert rooted == [[{"label": every[0][0]["label"], "score": pytest.approx(every[0][0]["score"])}]]
    with dialect_server.client() as client:
        zero = client.post("/predict", json={"model": "clf", "inputs": TEXTS[0], "top_k": 0})
    assert zero.status_code == 422
    assert zero.json()["error_type"] == "Validation"


def test_info_describes_a_model_without_loading_it(serve: Any, dialect_models: dict[str, Path]) -> None:
    names = ("dense", "clf")
    server = serve({"models": [{"name": n, "source": str(dialect_models[n])} for n in names]})
    with server.client() as client:
        cold = client.get("/info", params={"model": "clf"}).json()
        default = client.get("/info").json()
        states = {m["id"]: m["status"] for m in client.get("/v1/models").json()["data"]}
        client.post("/classify", json={"model": "clf", "input": "warm"}).raise_for_status()
        warm = client.get("/info", params={"model": "clf"}).json()
    assert states == {"dense": "unloaded", "clf": "unloaded"}
    assert (cold["model_id"], cold["kind"], cold["status"]) == ("clf", "classifier", "unloaded")
    assert (default["model_id"], default["kind"]) == ("dense", "dense")  # the only embedder
    assert warm["status"] == "loaded"
    assert warm["model_type"]["classifier"]["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert warm["max_input_length"] == 128
