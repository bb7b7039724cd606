"""The API document: valid OpenAPI 3.1, every route in it, Swagger UI offline, and a bounded fuzz run."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator
from starlette.routing import Mount, Route

from infinity_server.app import create_app
from infinity_server.openapi import document_path
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

# Named as the document's examples name the model, so that the examples reach the engine.
FAKE = {"name": "all-MiniLM-L6-v2", "source": "fake", "kind": "fake", "pin": True}
KEY = "fuzz-key"
#: Mounts that serve files, not operations: the Swagger UI assets.
ASSET_MOUNTS = {"/docs/assets"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Keys on, so that the document's security (bearer) is what the server enforces; admin routes
    # on through the admin scope; media fetches fail fast; the batch routes on.
    keys = [{"name": "fuzz", "key": KEY, "scopes": ["inference", "admin", "metrics"]}]
    batch_dir = str(tmp_path_factory.mktemp("batches"))
    server = ServerSettings(api_keys=keys, media_fetch_timeout=1, access_log=False, batch_dir=batch_dir)  # type: ignore[arg-type]
    live = start_server(create_app(Settings(server, registry_config({"models": [FAKE]}))))
    yield live
    live.close()


#: TEI's routes answer errors in TEI's shape; `/rerank` in the shape of the body it was given.
TEI_ERRORS = {
    **dict.fromkeys(
        ["/embed", "/embed_sparse", "/embed_all", "/predict", "/similarity", "/tokenize", "/decode", "/info", "/"],
        "TeiError",
    ),
    "/models/{name}": "TeiError",
    "/rerank": "EitherError",
}


def test_the_document_is_valid_openapi_3_1(server: LiveServer) -> None:
    with server.client() as client:
        document = client.get("/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    OpenAPIV31SpecValidator(document).validate()
    error = document["components"]["schemas"]["ErrorResponse"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400 and not (path == "/ready" and status == "503"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    shape = TEI_ERRORS.get(path, "ErrorResponse")
                    assert ref == f"#/components/schemas/{shape}", f"{method} {path} {status}"
    assert error["required"] == ["error"]
    assert set(document["components"]["schemas"]["TeiError"]["required"]) == {"error", "error_type"}


def served_operations(app: Any) -> set[tuple[str, str]]:
    served = set()
    for route in app.routes:
        if isinstance(route, Route):
            served |= {(m, document_path(route.path)) for m in route.methods or () if m != "HEAD"}
        else:
            assert isinstance(route, Mount), f"unexpected route type {route!r}"
            assert route.path in ASSET_MOUNTS, f"mount {route.path} is not documented"
    return served


def test_every_route_of_the_app_is_documented_and_nothing_else(server: LiveServer) -> None:
    with server.client() as client:
        document = client.get("/openapi.json").json()
    documented = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    served = served_operations(server.app)
    assert served - documented == set(), "routes without an entry in infinity_server/openapi.py's OPERATIONS"
    assert documented - served == set(), "entries in OPERATIONS that the app does not serve"


def test_swagger_ui_is_served_from_packaged_assets(server: LiveServer) -> None:
    with server.client() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert len(assets) == 2
        for asset in assets:
            assert not asset.startswith(("http:", "https:", "//")), "the page must work offline"
            response = client.get("/" + asset)
            assert response.status_code == 200, asset
            assert len(response.content) > 10_000
        assert 'url: "openapi.json"' in page.text


#: Every check that compares an answer with the document, plus no 5xx and auth enforcement.
#: `positive_data_acceptance` is left out: the schemas cannot say which model exists or can
#: rerank, so schema-valid bodies rightly get 400/404 from the engine.
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
    "response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method,"
    "allow_header_conformance,ignored_auth"
)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_answer_off_the_document(server: LiveServer, tmp_path: Path) -> None:
    # One worker: CPython 3.11's `ast` checks its recursion depth per interpreter, not per thread, so
    # two workers building strategies at once can fail with "AST constructor recursion depth mismatch".
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json"),
        *("--checks", CHECKS, "--max-examples", "6", "--max-time", "25", "--seed", "7", "--workers", "1"),
        *("--header", f"Authorization: Bearer {KEY}", "--request-timeout", "10", "--no-color"),
        *("--phases", "examples,coverage,fuzzing"),
    ]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    selected, tested = re.search(r"Selected: (\d+)/(\d+)", run.stdout), re.search(r"Tested: (\d+)", run.stdout)
    assert selected is not None, report
    assert tested is not None, report
    assert selected.group(1) == selected.group(2) == tested.group(1), report
    assert "✅ Examples" in run.stdout, report  # the example bodies reached the engine
