"""API keys and scopes over real HTTP: 401 without a key, 403 without the scope, admin off by default."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from infinity_server.auth import keyring
from infinity_server.settings import ServerSettings, load_settings
from model_registry.errors import ConfigError

pytestmark = pytest.mark.integration

FAKE = {"name": "fake", "source": "fake", "kind": "fake", "pin": True}
EMBED = {"model": "fake", "input": ["a b"]}


def bearer(key: str | bytes) -> dict[str, Any]:
    value = key if isinstance(key, bytes) else key.encode()
    return {"Authorization": b"Bearer " + value}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    (folder / "ops.key").write_text("ops-secret\n")
    listing = folder / "keys.yaml"
    listing.write_text(
        f"- name: ops\n  key_file: {folder / 'ops.key'}\n  scopes: [admin, metrics]\n"
        "- name: scraper\n  key_env: TEST_SCRAPER_KEY\n  scopes: [metrics]\n"
    )
    return listing


def test_scopes_decide_each_route(serve: Any, keys_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SCRAPER_KEY", "scrape-secret")
    hashed = hashlib.sha256(b"search-secret").hexdigest()
    server = serve(
        {"models": [FAKE]},
        api_keys=[{"name": "search", "sha256": hashed, "scopes": ["inference"]}],
        api_keys_file=str(keys_file),
    )
    with server.client() as client:
        assert client.post("/v1/embeddings", json=EMBED).status_code == 401
        assert client.post("/v1/embeddings", json=EMBED, headers=bearer("search-secret")).status_code == 200
        # An inference key on an admin route: 403, with the scope named.
        forbidden = client.post("/v1/models/fake/load", headers=bearer("search-secret"))
        assert forbidden.status_code == 403
        assert forbidden.json()["error"]["code"] == "insufficient_scope"
        assert "'admin'" in forbidden.json()["error"]["message"]
        assert client.get("/v1/memory", headers=bearer("ops-secret")).status_code == 200
        assert client.post("/v1/models/fake/load", headers=bearer("ops-secret")).status_code == 200
        assert client.post("/v1/embeddings", json=EMBED, headers=bearer("ops-secret")).status_code == 403
        assert client.get("/metrics", headers=bearer("scrape-secret")).status_code == 200
        assert client.get("/metrics", headers=bearer("search-secret")).status_code == 403
        assert client.get("/metrics").status_code == 401
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200


@pytest.mark.parametrize(
    "token",
    ["clé-secrète".encode(), b"\xff\xfe garbage\xc3", b"\xa0", b"search-secret\x80", b"search-secret" * 500],
)
def test_odd_tokens_are_401_not_500(serve: Any, token: bytes) -> None:
    server = serve({"models": [FAKE]}, api_keys=[{"name": "search", "key": "search-secret"}])
    with server.client() as client:
        response = client.post("/v1/embeddings", json=EMBED, headers=bearer(token))
        assert response.status_code == 401, response.text
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/embeddings", json=EMBED, headers=bearer("search-secret")).status_code == 200


def test_admin_routes_are_off_by_default_as_404(serve: Any) -> None:
    plain = serve({"models": [FAKE]})
    keyed = serve({"models": [FAKE]}, api_keys=[{"name": "search", "key": "s", "scopes": ["inference"]}])
    for server, headers in ((plain, {}), (keyed, bearer("s"))):
        with server.client() as client:
            for method, path in (("POST", "/v1/models/fake/load"), ("POST", "/v1/models/fake/unload")):
                response = client.request(method, path, headers=headers)
                assert response.status_code == 404
                assert response.json()["error"]["code"] == "admin_disabled"
            assert client.get("/v1/memory", headers=headers).status_code == 404
            assert client.post("/v1/embeddings", json=EMBED, headers=headers).status_code == 200


@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_trailing_newline_reaches_no_admin_route_without_its_scope(serve: Any, action: str) -> None:
    # `%0A` decodes to a newline, which route patterns (ending in `$`) let through at the end: the
    # scope is the one of the route that runs, the admin route, not the GET route of the same path.
    plain = serve({"models": [FAKE]})
    keys = [{"name": "search", "key": "s", "scopes": ["inference"]}, {"name": "ops", "key": "o", "scopes": ["admin"]}]
    keyed = serve({"models": [FAKE]}, api_keys=keys)
    for server, headers, want in ((plain, {}, 404), (keyed, bearer("s"), 403)):
        with server.client() as client:
            response = client.post(f"/v1/models/fake/{action}%0A", headers=headers)
            assert response.status_code == want, response.text
            assert client.post("/v1/embeddings", json=EMBED, headers=headers).status_code == 200


def test_admin_routes_explicitly_enabled_without_keys(serve: Any) -> None:
    server = serve({"models": [FAKE]}, admin_routes=True)
    with server.client() as client:
        assert client.get("/v1/memory").status_code == 200


def test_the_single_api_key_holds_every_scope(serve: Any) -> None:
    server = serve({"models": [FAKE]}, api_key="root")
    with server.client() as client:
        assert client.get("/v1/memory", headers=bearer("root")).status_code == 200
        assert client.get("/metrics", headers=bearer("root")).status_code == 200
        assert client.get("/v1/memory", headers=bearer("nope")).status_code == 401


def settings(data: dict[str, Any]) -> ServerSettings:
    return ServerSettings.model_validate(data)


def test_key_sources_are_checked_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TEST_MISSING_KEY"):
        keyring(settings({"api_keys": [{"name": "k", "key_env": "TEST_MISSING_KEY"}]}), environ={})
    with pytest.raises(ConfigError, match="exactly one of key, sha256"):
        load_settings(flags={"api_keys": [{"name": "k", "key": "a", "sha256": "0" * 64}]}, environ={})
    with pytest.raises(ConfigError, match="unique"):
        keyring(settings({"api_key": "x", "api_keys": [{"name": "api_key", "key": "y"}]}), environ={})
    listing = tmp_path / "keys.yaml"
    listing.write_text("name: not-a-list\n")
    loaded = load_settings(environ={"INFINITY_SERVER_API_KEYS_FILE": str(listing)})
    with pytest.raises(ConfigError, match="YAML list"):
        keyring(loaded.server, environ={})


def test_key_in_the_clear_is_not_kept() -> None:
    ring = keyring(settings({"api_keys": [{"name": "k", "key": "plain"}]}), environ={})
    assert ring.keys[0].digest == hashlib.sha256(b"plain").digest()
    assert ring.match(b"plain") is ring.keys[0]
    assert ring.match(b"plain ") is None


def test_raising_priority_needs_the_priority_scope(serve: Any) -> None:
    keys = [
        {"name": "search", "key": "s", "scopes": ["inference"]},
        {"name": "urgent", "key": "u", "scopes": ["inference", "priority"]},
    ]
    server = serve({"models": [FAKE]}, api_keys=keys)
    with server.client() as client:
        for priority in (-5, 0):
            lowered = client.post("/v1/embeddings", json={**EMBED, "priority": priority}, headers=bearer("s"))
            assert lowered.status_code == 200
        raised = client.post("/v1/embeddings", json={**EMBED, "priority": 5}, headers=bearer("s"))
        assert raised.status_code == 403
        assert raised.json()["error"]["param"] == "priority"
        assert client.post("/rerank", json={"model": "fake", "query": "q", "documents": ["d"], "priority": 1},
                           headers=bearer("s")).status_code == 403  # fmt: skip
        assert client.post("/v1/embeddings", json={**EMBED, "priority": 5}, headers=bearer("u")).status_code == 200
    opened = serve({"models": [FAKE]}, api_keys=keys[:1], allow_client_priority=True)
    with opened.client() as client:
        assert client.post("/v1/embeddings", json={**EMBED, "priority": 5}, headers=bearer("s")).status_code == 200


def _exchange(sock: socket.socket, head: bytes, body: bytes, pause: float) -> bytes:
    """One request on a kept-alive socket, its body sent `pause` seconds after its head; the answer's
    status line and headers (the bodies here are short JSON, read with them)."""
    sock.sendall(head)
    time.sleep(pause)
    sock.sendall(body)
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def _length(answer: bytes) -> int:
    head = answer.partition(b"\r\n\r\n")[0].lower()
    line = next((row for row in head.split(b"\r\n") if row.startswith(b"content-length:")), b"content-length: 0")
    return int(line.split(b":")[1])


def test_a_request_refused_before_its_body_arrives_leaves_the_connection_usable(serve: Any) -> None:
    """401 and 415 are decided from the headers (the upload route's 415 too: JSON where it takes
    multipart); the body is still read (and dropped) before the answer, so the connection stays
    usable for the client's next request."""
    server = serve({"models": [FAKE]}, api_key="secret")
    body = json.dumps(EMBED).encode()

    def request(key: str, content_type: str, path: str = "/v1/embeddings") -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()

    upload = request("secret", "application/json", "/v1/embeddings/upload")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        assert _exchange(sock, request("nope", "application/json"), body, 0.3).startswith(b"HTTP/1.1 401")
        assert _exchange(sock, request("secret", "text/plain"), body, 0.3).startswith(b"HTTP/1.1 415")
        assert _exchange(sock, upload, body, 0.3).startswith(b"HTTP/1.1 415")
        assert _exchange(sock, request("secret", "application/json"), body, 0.0).startswith(b"HTTP/1.1 200")
