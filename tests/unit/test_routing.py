"""Each route declared once: every operation complete, its path written once in the source, and
its types read from its handler's signature."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
from starlette.requests import Request

from infinity_server.app import ROUTES
from infinity_server.routing import Operation, Vectors, operations_of, post
from infinity_server.schemas.infinity import ClassifyRequest
from infinity_server.schemas.responses import ClassifyResponse, Health

SOURCE = Path(__file__).resolve().parents[2] / "src" / "infinity_server"
OPERATIONS = operations_of(ROUTES)


def _complete(op: Operation) -> list[str]:
    """What `op` lacks for the document: a summary, a JSON answer's type, a read body's type."""
    missing = []
    if not op.summary.strip():
        missing.append("a summary")
    if op.response_type == "application/json" and op.response is None:
        missing.append("a response type")
    if op.body is not None and op.request is None:
        missing.append("a request type")
    return missing


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
def test_every_operation_has_a_summary_and_its_types(op: Operation) -> None:
    assert _complete(op) == [], f"{op.method} {op.path} lacks {', '.join(_complete(op))}"


async def _untyped(request: Request, body: ClassifyRequest) -> object:
    return None


def test_an_operation_without_a_summary_or_answer_type_is_caught() -> None:
    incomplete = post("/nowhere", _untyped, " ", response=None)
    assert _complete(incomplete) == ["a summary", "a response type"]


async def _classify(request: Request, body: ClassifyRequest) -> Vectors[ClassifyResponse]:
    raise AssertionError("never called")


async def _health(request: Request) -> Health:
    raise AssertionError("never called")


def test_the_types_are_read_from_the_handler() -> None:
    with_body = post("/a", _classify, "A")
    assert (with_body.request, with_body.response, with_body.body) == (
        ClassifyRequest,
        ClassifyResponse,
        ClassifyRequest,
    )
    without = post("/b", _health, "B")
    assert (without.request, without.response, without.body) == (None, Health, None)


def _string_constants() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found[node.value] += 1
    return found


def test_each_route_path_is_written_once_in_the_source() -> None:
    written = _string_constants()
    # "/" is also the separator that splits content types and file names.
    twice = {op.path: written[op.path] for op in OPERATIONS if written[op.path] != 1 and op.path != "/"}
    # A path shared by several methods is one declaration per method.
    methods = Counter(op.path for op in OPERATIONS)
    assert {path: n for path, n in twice.items() if n != methods[path]} == {}


def test_one_operation_per_method_and_path() -> None:
    pairs = Counter((op.method, op.path) for op in OPERATIONS)
    assert [pair for pair, n in pairs.items() if n > 1] == []
