"""The JSON content-type check, on a bare ASGI app that records whether it was reached."""

from __future__ import annotations

import asyncio
import gzip

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from infinity_server.app import ROUTES
from infinity_server.content_type import JsonContentType, is_json
from infinity_server.routing import Routed

BODY = b'{"model": "m", "input": "hello"}'


class Reached:
    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def send(
    method: str, path: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes | None = BODY
) -> tuple[httpx.Response, list[str]]:
    inner = Reached()

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=Routed(JsonContentType(inner), routes=ROUTES))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, content=body, headers=headers)

    return asyncio.run(run()), inner.paths


def post(
    path: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes = BODY
) -> tuple[httpx.Response, list[str]]:
    return send("POST", path, headers, body)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"],
)
def test_a_body_of_another_type_is_415_before_the_route(content_type: str) -> None:
    response, reached = post("/v1/embeddings", {"content-type": content_type})
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert content_type in error["message"]
    assert reached == []


def test_a_body_with_no_content_type_is_415() -> None:
    response, reached = post("/rerank", {})
    assert response.status_code == 415
    assert "no content type" in response.json()["error"]["message"]
    assert reached == []


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/vnd.api+json"]
)
def test_json_types_pass(content_type: str) -> None:
    response, reached = post("/v1/embeddings", {"content-type": content_type})
    assert response.status_code == 200
    assert reached == ["/v1/embeddings"]


def test_upload_routes_and_empty_bodies_pass() -> None:
    assert post("/v1/embeddings/upload", {"content-type": "multipart/form-data; boundary=x"})[1] == [
        "/v1/embeddings/upload"
    ]
    assert post("/v1/models/m/load", {}, body=b"")[1] == ["/v1/models/m/load"]


def test_is_json() -> None:
    assert is_json("Application/JSON")
    assert not is_json("text/json+plain")
    assert not is_json("")


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", ""])
def test_an_upload_route_takes_only_multipart(content_type: str) -> None:
    response, reached = post("/v1/embeddings/upload", {"content-type": content_type} if content_type else {})
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "multipart/form-data" in response.json()["error"]["message"]
    assert reached == []


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("coding", ["gzip", "GZIP", "br", "deflate", "identity, gzip", "x-custom"])
def test_an_encoded_body_is_415_naming_the_header_before_the_route(coding: str) -> None:
    response, reached = post("/v1/embeddings", {**JSON, "content-encoding": coding}, gzip.compress(BODY))
    assert response.status_code == 415
    assert response.headers["accept-encoding"] == "identity"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "unsupported_content_encoding"
    assert error["type"] == "invalid_request_error"
    assert "Content-Encoding" in error["message"]
    assert coding.split(", ")[-1].lower() in error["message"]
    assert "identity" in error["message"]
    assert reached == []


def test_an_encoded_body_is_refused_in_the_routes_shape_and_on_upload_routes() -> None:
    tei, reached = post("/embed", {**JSON, "content-encoding": "gzip"})
    assert tei.status_code == 415
    assert set(tei.json()) == {"error", "error_type"}
    assert "Content-Encoding: gzip" in tei.json()["error"]
    upload, reached_upload = post(
        "/v1/embeddings/upload", {"content-type": "multipart/form-data; boundary=x", "content-encoding": "gzip"}
    )
    assert upload.status_code == 415
    assert upload.json()["error"]["code"] == "unsupported_content_encoding"
    assert reached == reached_upload == []


def test_a_second_encoding_header_is_read_too() -> None:
    response, reached = post(
        "/v1/embeddings", [*JSON.items(), ("content-encoding", "identity"), ("content-encoding", "br")]
    )
    assert response.status_code == 415
    assert reached == []


@pytest.mark.parametrize("coding", ["identity", "Identity", ""])
def test_identity_passes(coding: str) -> None:
    response, reached = post("/v1/embeddings", {**JSON, "content-encoding": coding})
    assert response.status_code == 200
    assert reached == ["/v1/embeddings"]


def test_a_long_encoding_is_cut_in_the_message() -> None:
    response, _ = post("/v1/embeddings", {**JSON, "content-encoding": "x" * 5000})
    assert response.status_code == 415
    assert len(response.json()["error"]["message"]) < 400


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/openapi.json"])
def test_requests_without_a_body_method_pass_whatever_their_encoding(path: str) -> None:
    response, reached = send("GET", path, {"content-encoding": "gzip"}, body=None)
    assert response.status_code == 200
    assert reached == [path]
