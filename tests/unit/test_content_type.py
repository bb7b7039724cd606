"""The JSON content-type check, on a bare ASGI app that records whether it was reached."""

from __future__ import annotations

import asyncio

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


def post(path: str, headers: dict[str, str], body: bytes = BODY) -> tuple[httpx.Response, list[str]]:
    inner = Reached()

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=Routed(JsonContentType(inner), routes=ROUTES))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, content=body, headers=headers)

    return asyncio.run(run()), inner.paths


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
