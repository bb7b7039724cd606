"""Every kind of bad request gets a clear 4xx in the documented shape; the server keeps serving."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
GOOD = {"model": MODEL, "input": ["still fine"]}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import load_settings
    from tests.conftest import start_server

    live = start_server(create_app(load_settings(None, environ={})))
    yield live
    live.close()


CASES: list[tuple[str, Any, int, str]] = [
    ("malformed JSON", b'{"model": "all-MiniLM-L6-v2", "input": [', 422, "invalid_json"),
    ("not an object", b"[1, 2, 3]", 422, "invalid_body"),
    ("empty body", b"", 422, "invalid_body"),
    ("input of the wrong type", {"model": MODEL, "input": 42}, 422, "invalid_body"),
    ("mixed input list", {"model": MODEL, "input": ["a", 1]}, 422, "invalid_body"),
    ("model of the wrong type", {"model": 7, "input": ["a"]}, 422, "invalid_body"),
    ("missing input", {"model": MODEL}, 422, "invalid_body"),
    ("missing model", {"input": ["a"]}, 422, "invalid_body"),
    ("bad encoding_format", {"model": MODEL, "input": ["a"], "encoding_format": "hex"}, 422, "invalid_body"),
    ("empty list", {"model": MODEL, "input": []}, 400, "invalid_input"),
    ("empty string", {"model": MODEL, "input": ""}, 400, "invalid_input"),
    ("blank string in a list", {"model": MODEL, "input": ["ok", "   "]}, 400, "invalid_input"),
    ("10,000 inputs", {"model": MODEL, "input": ["word"] * 10_000}, 400, "invalid_input"),
    ("a 1 MB string", {"model": MODEL, "input": ["x" * 1_000_000]}, 400, "invalid_input"),
    ("token id outside the vocabulary", {"model": MODEL, "input": [101, 99_999_999, 102]}, 400, "invalid_input"),
    ("unknown model", {"model": "no-such-model", "input": ["a"]}, 404, "model_not_found"),
    (
        "over the limit, truncate false",
        {"model": MODEL, "input": ["w " * 400], "truncate": False},
        400,
        "input_too_long",
    ),
    ("dimensions negative", {"model": MODEL, "input": ["a"], "dimensions": -1}, 400, "invalid_input"),
    ("dimensions too large", {"model": MODEL, "input": ["a"], "dimensions": 385}, 400, "invalid_input"),
    ("unknown prompt name", {"model": MODEL, "input": ["a"], "prompt_name": "query"}, 400, "invalid_input"),
]


@pytest.mark.parametrize(("case", "body", "status", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_a_clear_error(server: LiveServer, case: str, body: Any, status: int, code: str) -> None:
    with server.client() as client:
        if isinstance(body, bytes):
            response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        else:
            response = client.post("/v1/embeddings", json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == code
        assert error["type"] == "invalid_request_error"
        assert len(error["message"]) > 10
        assert client.post("/v1/embeddings", json=GOOD).status_code == 200


def test_a_body_over_the_size_limit_is_413(server: LiveServer) -> None:
    body = b'{"model": "all-MiniLM-L6-v2", "input": ["' + b"a" * (17 * 2**20) + b'"]}'
    with server.client() as client:
        response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
        assert client.post("/v1/embeddings", json=GOOD).status_code == 200


def test_a_streamed_body_over_the_limit_is_413(server: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "all-MiniLM-L6-v2", "input": ["'
        for _ in range(17):
            yield b"a" * 2**20
        yield b'"]}'

    with server.client() as client:
        response = client.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert client.post("/v1/embeddings", json=GOOD).status_code == 200


def test_a_compressed_body_is_415_and_the_connection_stays_usable(server: LiveServer) -> None:
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    with server.client() as client:
        response = client.post("/v1/embeddings", content=gzip.compress(orjson.dumps(GOOD)), headers=headers)
        assert response.status_code == 415, response.text
        assert response.headers["accept-encoding"] == "identity"
        error = response.json()["error"]
        assert error["code"] == "unsupported_content_encoding"
        assert "Content-Encoding: gzip" in error["message"]
        assert client.post("/v1/embeddings", json=GOOD).status_code == 200
        assert client.get("/health", headers={"content-encoding": "gzip"}).status_code == 200


def test_unknown_routes_and_methods_use_the_error_shape(server: LiveServer) -> None:
    with server.client() as client:
        missing = client.get("/v1/nothing")
        wrong = client.get("/v1/embeddings")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
