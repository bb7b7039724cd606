"""The API document: valid OpenAPI 3.1, every route in it, Swagger UI offline, and a bounded fuzz run;
and every route's errors in the shape it declares. Cases come from the app's declared operations."""

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

from infinity_server.app import ROUTES, create_app
from infinity_server.errors import Shape
from infinity_server.openapi import document_path
from infinity_server.routing import Operation, operations_of
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


#: The document's name for the body of each declared set of error shapes.
ERROR_COMPONENTS = {
    (Shape.OPENAI,): "ErrorResponse",
    (Shape.TEI,): "TeiError",
    (Shape.OPENAI, Shape.TEI): "EitherError",
}


def test_tei_routes_declare_tei_errors_and_rerank_both() -> None:
    shapes = {(op.method, document_path(op.path)): op.shapes for op in operations_of(ROUTES)}
    for path in ("/embed", "/embed_sparse", "/predict", "/tokenize", "/", "/models/{name}"):
        assert shapes[("POST", path)] == (Shape.TEI,), path
    assert shapes[("GET", "/info")] == (Shape.TEI,)
    assert shapes[("POST", "/rerank")] == (Shape.OPENAI, Shape.TEI)
    assert shapes[("POST", "/v1/embeddings")] == (Shape.OPENAI,)


def test_the_document_is_valid_openapi_3_1(server: LiveServer) -> None:
    with server.client() as client:
        document = client.get("/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    OpenAPIV31SpecValidator(document).validate()
    error = document["components"]["schemas"]["ErrorResponse"]
    declared = {(op.method.lower(), document_path(op.path)): op for op in operations_of(server.app.routes)}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400 and not (path == "/ready" and status == "503"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    shape = ERROR_COMPONENTS[declared[(method, path)].shapes]
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
    assert served - documented == set(), "routes the app serves that the document leaves out"
    assert documented - served == set(), "operations in the document that the app does not serve"
    assert len(served) == len(operations_of(server.app.routes)), "one operation per method and path"


def _shape_of(body: Any) -> Shape:
    """Which error shape an answer is in, read from the body alone."""
    if isinstance(body.get("error"), dict) and {"message", "type", "code"} <= body["error"].keys():
        return Shape.OPENAI
    assert isinstance(body.get("error"), str), body
    assert isinstance(body.get("error_type"), str), body
    return Shape.TEI


def _url(op: Operation) -> str:
    return re.sub(r"{\w+(?::\w+)?}", "nope", op.path)


def _without_a_key() -> list[Operation]:
    return [op for op in operations_of(ROUTES) if op.scope is not None]


@pytest.mark.parametrize("op", _without_a_key(), ids=lambda op: f"{op.method} {op.path}")
def test_a_refusal_before_the_route_comes_in_the_declared_shape(server: LiveServer, op: Operation) -> None:
    with server.client() as client:
        response = client.request(op.method, _url(op), json={"model": "all-MiniLM-L6-v2"})
    assert response.status_code == 401, response.text
    assert _shape_of(response.json()) == op.shapes[0]


def _bodies() -> list[tuple[Operation, bytes, Shape]]:
    """A JSON body the route refuses (an array, not an object), per JSON body route, and TEI's
    rerank body with a field of the wrong type, which the shared rerank route answers in TEI's shape."""
    cases = [
        (op, b"[]", op.shapes[0])
        for op in operations_of(ROUTES)
        if op.body is not None and op.request_type == "application/json"
    ]
    rerank = next(op for op in operations_of(ROUTES) if Shape.TEI in op.shapes and len(op.shapes) > 1)
    return [*cases, (rerank, b'{"query": "q", "texts": "not a list"}', Shape.TEI)]


@pytest.mark.parametrize(("op", "body", "shape"), _bodies(), ids=lambda c: getattr(c, "path", None))
def test_a_bad_body_is_refused_in_the_declared_shape(
    server: LiveServer, op: Operation, body: bytes, shape: Shape
) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with server.client() as client:
        response = client.request(op.method, _url(op), content=body, headers=headers)
        assert client.get("/health").status_code == 200
    assert response.status_code == 422, response.text
    assert _shape_of(response.json()) == shape


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
