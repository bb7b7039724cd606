"""Cohere's rerank over plain HTTP: v1's object documents ranked on their `rank_fields`, each
document's text written as docs/dialects/cohere.md fixes it (one field: its value; several: one
`key: value` line each, in rank_fields' order), compared with Infinity's /rerank of those texts;
v2's strings (and `{text}` objects); and the errors that name the document and the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.conftest import post

pytestmark = pytest.mark.integration

QUERY = "a guitar player"
BOOKS: list[dict[str, Any]] = [
    {"title": "Stock markets", "text": "The stock market fell sharply on Monday.", "year": 2020},
    {"title": "Music lessons", "text": "A man is playing a guitar.", "year": 1999},
    {"title": "Winter walks", "text": "A dog runs in the snow.", "year": 2011},
]


def infinity_scores(server: LiveServer, texts: list[str]) -> dict[int, float]:
    ranked = post(server, "/rerank", {"model": "ce", "query": QUERY, "documents": texts})["results"]
    return {r["index"]: r["relevance_score"] for r in ranked}


def cohere_scores(answer: dict[str, Any]) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in answer["results"]}


def test_objects_rank_on_their_rank_fields_one_key_value_line_each(dialect_server: LiveServer) -> None:
    body = {"model": "ce", "query": QUERY, "documents": BOOKS, "rank_fields": ["title", "text"]}
    answer = post(dialect_server, "/v1/rerank", {**body, "return_documents": True})
    lines = [f"title: {b['title']}\ntext: {b['text']}" for b in BOOKS]
    assert cohere_scores(answer) == pytest.approx(infinity_scores(dialect_server, lines), abs=1e-6)
    assert [r["document"] for r in answer["results"]] == [BOOKS[r["index"]] for r in answer["results"]]
    reordered = post(dialect_server, "/v1/rerank", {**body, "rank_fields": ["text", "title"]})
    swapped = [f"text: {b['text']}\ntitle: {b['title']}" for b in BOOKS]
    assert cohere_scores(reordered) == pytest.approx(infinity_scores(dialect_server, swapped), abs=1e-6)


def test_one_rank_field_is_its_value_and_the_default_is_text(dialect_server: LiveServer) -> None:
    body = {"model": "ce", "query": QUERY, "documents": BOOKS}
    by_title = post(dialect_server, "/v1/rerank", {**body, "rank_fields": ["title"]})
    by_text = post(dialect_server, "/v1/rerank", body)
    named_text = post(dialect_server, "/v1/rerank", {**body, "rank_fields": ["text"]})
    assert cohere_scores(by_title) == pytest.approx(infinity_scores(dialect_server, [b["title"] for b in BOOKS]))
    assert cohere_scores(by_text) == pytest.approx(infinity_scores(dialect_server, [b["text"] for b in BOOKS]))
    assert cohere_scores(named_text) == cohere_scores(by_text)


def test_strings_and_objects_mix_and_come_back_as_sent(dialect_server: LiveServer) -> None:
    documents: list[Any] = [
        "A man is playing a guitar.",
        {"name": "snow", "body": "A dog runs in the snow.", "tags": ["x"]},
    ]
    body = {"model": "ce", "query": QUERY, "documents": documents, "rank_fields": ["name", "body"]}
    answer = post(dialect_server, "/v1/rerank", body)  # v1 returns documents unless told not to
    by_index = {r["index"]: r["document"] for r in answer["results"]}
    assert by_index == {0: {"text": documents[0]}, 1: documents[1]}
    texts = [documents[0], "name: snow\nbody: A dog runs in the snow."]
    assert cohere_scores(answer) == pytest.approx(infinity_scores(dialect_server, texts), abs=1e-6)
    bare = post(dialect_server, "/v1/rerank", {**body, "return_documents": False})
    assert all(set(r) == {"index", "relevance_score"} for r in bare["results"])


def test_v2_takes_strings_and_text_objects(dialect_server: LiveServer) -> None:
    texts = [b["text"] for b in BOOKS]
    documents: list[Any] = [texts[0], {"text": texts[1]}, texts[2]]
    answer = post(dialect_server, "/v2/rerank", {"model": "ce", "query": QUERY, "documents": documents})
    assert cohere_scores(answer) == pytest.approx(infinity_scores(dialect_server, texts), abs=1e-6)


#: Each refusal: the body's changes, the status, the param and what its message must name.
REFUSED: list[tuple[str, str, dict[str, Any], int, str, list[str]]] = [
    (
        "a missing field",
        "/v1/rerank",
        {"rank_fields": ["title", "author"]},
        400,
        "documents",
        ["document 0", "'author'"],
    ),
    ("no text field", "/v1/rerank", {"documents": [{"title": "x"}]}, 400, "documents", ["document 0", "'text'"]),
    ("a number field", "/v1/rerank", {"rank_fields": ["year"]}, 400, "documents", ["document 0", "'year'", "number"]),
    ("a null field", "/v1/rerank", {"documents": ["a", {"text": None}]}, 400, "documents", ["document 1", "'text'"]),
    ("an array document", "/v1/rerank", {"documents": [["a"]]}, 400, "documents", ["document 0", "array"]),
    ("a field named twice", "/v1/rerank", {"rank_fields": ["title", "title"]}, 400, "rank_fields", ["'title'"]),
    ("no rank fields", "/v1/rerank", {"rank_fields": []}, 422, "rank_fields", ["rank_fields"]),
    ("an object on v2", "/v2/rerank", {}, 400, "documents", ["document 0", "/v2/rerank takes strings"]),
    (
        "a text over the input limit",
        "/v1/rerank",
        {"documents": [{"a": "x " * 30_000, "b": "y " * 30_000}], "rank_fields": ["a", "b"]},
        400,
        "documents",
        ["document 0", "characters"],
    ),
]


@pytest.mark.parametrize(("case", "path", "change", "status", "param", "named"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_bad_document_or_field_is_refused_naming_it(
    dialect_server: LiveServer, case: str, path: str, change: dict[str, Any], status: int, param: str, named: list[str]
) -> None:
    body = {"model": "ce", "query": QUERY, "documents": BOOKS, **change}
    with dialect_server.client() as client:
        response = client.post(path, json=body)
        assert client.get("/health").status_code == 200
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    for part in named:
        assert part in error["message"]


def test_a_long_field_name_is_quoted_cut_short(dialect_server: LiveServer) -> None:
    body = {"model": "ce", "query": QUERY, "documents": BOOKS, "rank_fields": ["k" * 250]}
    with dialect_server.client() as client:
        response = client.post("/v1/rerank", json=body)
        huge = client.post("/v1/rerank", json=body | {"rank_fields": ["k" * 100_000]})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("document 0 has no field 'kkkk")
    assert len(message) < 400
    # A name longer than any name may be (256 characters) is refused by the body's schema.
    assert huge.status_code == 422, huge.text
    assert huge.json()["error"]["param"] == "rank_fields"
    assert len(huge.json()["error"]["message"]) < 400
