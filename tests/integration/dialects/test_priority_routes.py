"""Every route whose body takes a `priority` refuses a raised one from a key without the `priority`
scope (403), TEI's `POST /` and `POST /models/{name}` included. The routes come from the app's
declared operations, so a new route with a priority is checked without being listed here.

Cohere's and vLLM's own `priority` runs lower numbers first (0 the default and highest): on their
routes a raised priority is a negative number."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from infinity_server.app import ROUTES
from infinity_server.openapi import document_path
from infinity_server.routing import Operation, operations_of
from infinity_server.settings import ApiKeySpec
from tests.conftest import LiveServer

pytestmark = pytest.mark.integration

FAKE = {"name": "fake", "source": "fake", "kind": "fake"}
PLAIN = {"Authorization": "Bearer plain"}
URGENT = {"Authorization": "Bearer urgent"}
#: The routes of the dialects whose `priority` runs lower numbers first.
LOWER_FIRST = {"/v1/rerank", "/v2/rerank", "/v1/embed", "/v2/embed", "/score", "/v1/score", "/pooling"}


def _takes_priority(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "priority" in schema.get("properties", {}) or any(_takes_priority(v) for v in schema.values())
    return isinstance(schema, list) and any(_takes_priority(v) for v in schema)


def _with_priority() -> list[Operation]:
    return [
        op
        for op in operations_of(ROUTES)
        if op.request is not None and _takes_priority(TypeAdapter(op.request).json_schema())
    ]


#: What a route's body holds besides `model` and `priority`, where it differs from `input`.
EXTRA: dict[str, dict[str, Any]] = {
    "/": {"inputs": "a b"},
    "/models/fake": {"inputs": "a b"},
    "/embed": {"inputs": "a b"},
}
#: Second bodies on routes that serve two shapes.
ALSO: list[tuple[str, dict[str, Any]]] = [
    ("/rerank", {"model": "fake", "query": "q", "texts": ["a"]}),  # TEI's shape of /rerank
    ("/", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),  # POST / as /similarity
    ("/models/fake", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
]


@pytest.fixture(scope="module")
def server() -> Any:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from tests.conftest import start_server

    keys = (
        ApiKeySpec(name="plain", key="plain"),
        ApiKeySpec(name="urgent", key="urgent", scopes=("inference", "priority")),
    )
    settings = Settings(ServerSettings(api_keys=keys), registry_config({"models": [FAKE]}))
    live = start_server(create_app(settings))
    yield live
    live.close()


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for op in _with_priority():
        path = document_path(op.path).replace("{name}", "fake")
        cases.append((path, {"model": "fake", **EXTRA.get(path, {})}))
    return cases + ALSO


def test_the_document_lists_every_route_that_takes_a_priority() -> None:
    paths = {document_path(op.path) for op in _with_priority()}
    assert {"/", "/models/{name}", "/embed", "/predict", "/rerank", "/v1/embeddings", "/v2/embed"} <= paths
    assert "/tokenize" not in paths


@pytest.mark.parametrize(("path", "body"), _cases(), ids=[f"{p} {sorted(b)}" for p, b in _cases()])
def test_a_raised_priority_needs_the_priority_scope(server: LiveServer, path: str, body: dict[str, Any]) -> None:
    raised, lowered_to = (-100, 5) if path in LOWER_FIRST else (100, -5)
    with server.client() as client:
        refused = client.post(path, json={**body, "priority": raised}, headers=PLAIN)
        lowered = client.post(path, json={**body, "priority": lowered_to}, headers=PLAIN)
        granted = client.post(path, json={**body, "priority": raised}, headers=URGENT)
    assert refused.status_code == 403, refused.text
    message = refused.json()["error"]
    assert "priority" in (message if isinstance(message, str) else message["message"])
    assert lowered.status_code != 403, lowered.text
    assert granted.status_code != 403, granted.text


def test_cohere_and_vllm_priorities_run_lower_numbers_first() -> None:
    from infinity_server.schemas.cohere import CohereEmbedRequest, CohereRerankRequest
    from infinity_server.schemas.vllm import PoolingRequest, ScoreRequest

    bodies: dict[type[BaseModel], dict[str, Any]] = {
        CohereRerankRequest: {"model": "m", "query": "q", "documents": ["a"]},
        CohereEmbedRequest: {"model": "m", "texts": ["a"]},
        ScoreRequest: {"model": "m", "text_1": "a", "text_2": "b"},
        PoolingRequest: {"model": "m", "input": "a"},
    }
    for schema, body in bodies.items():
        validated = [schema.model_validate({**body, "priority": p}) for p in (3, 0, -2)]
        assert [getattr(v, "priority") for v in validated] == [-3, 0, 2]  # noqa: B009
